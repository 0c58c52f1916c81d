"""The popularity reference point under user-level differential privacy: noisy item counts.

Each user contributes a 0/1 vector over the catalogue with ones on at most ``k`` of its
distinct training items (all of them when it has no more than ``k``; otherwise ``k`` drawn
without replacement from its own keyed stream, which depends on the seed and the user only,
so a user's draw does not depend on who else is in the data). Adding or removing one user
changes the sum of these vectors by at most sqrt(k) in L2 norm; Gaussian noise of standard
deviation z*sqrt(k) on every item's count (items nobody counted included) makes the released
count vector one Gaussian release of noise multiplier z, accounted by the project's RDP
accountant (:func:`fedrecgel.accountant.release_epsilon`): (epsilon, delta)-DP for each user,
delta = 1/users unless given. Every user's candidates are then ranked by the noisy counts, a
post-processing that spends nothing more (ties count against the held-out item, as in the
plain popularity ranking).

The noise here is drawn from a stream keyed by the run seed, so that runs repeat: a
simulation, as the simulator's noise is. A deployment would draw it from secret randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

from fedrecgel.accountant import calibrate_release, release_epsilon
from fedrecgel.baselines import _fixed_ranking
from fedrecgel.config import ConfigError
from fedrecgel.data import Split
from fedrecgel.prior import split_bounded_counts
from fedrecgel.simulate import RunResult

#: items a user counts at most when none is named (chosen on validation HR@10 only, seed 100,
#: over FilmTrust, Amazon-Video and Lastfm-2K clean at epsilon 1, 3 and 8:
#: bench/dp_popularity.py)
DEFAULT_MAX_ITEMS = 10
#: the key of the noise (apart from every other stream; the users' draws are
#: :func:`fedrecgel.prior.user_draw`'s)
_NOISE_KEY = 0xC0118


@dataclass(frozen=True)
class CountRelease:
    """How the noisy counts are released: at most ``max_items`` items per user, noise
    multiplier ``noise`` (std noise * sqrt(max_items)), and the privacy that buys."""

    max_items: int  # k
    noise: float  # z
    delta: float
    epsilon: float  # at delta, one Gaussian release, add-or-remove-one user
    target_epsilon: float | None

    @property
    def sensitivity(self) -> float:
        """The L2 norm by which one user can change the count vector: sqrt(k)."""
        return math.sqrt(self.max_items)

    @property
    def noise_std(self) -> float:
        """The standard deviation of each item's noise: z * sqrt(k)."""
        return self.noise * self.sensitivity

    def to_json(self) -> dict[str, object]:
        """The record of ``results.json`` (``runs[].privacy``)."""
        return {
            "mechanism": "gaussian item counts, one release",
            "neighbouring": "add or remove one user",
            "accountant": "dp-accounting RDP",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "noise_multiplier": self.noise,
            "max_items": self.max_items,
            "sensitivity": self.sensitivity,
            "noise_std": self.noise_std,
        }


def plan_release(
    n_users: int,
    max_items: int = DEFAULT_MAX_ITEMS,
    target_epsilon: float | None = None,
    noise: float | None = None,
    delta: float | None = None,
) -> CountRelease:
    """The release for ``n_users`` users: z calibrated to ``target_epsilon`` (the smallest that
    stays within it) or ``noise`` as given (and then, with a target, checked against it).

    Raises :class:`ConfigError` naming the setting that is out of bounds.
    """
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise ConfigError("dp_max_items", f"must be an integer >= 1, got {max_items!r}")
    if n_users < 1:
        raise ConfigError("n_users", "a DP release needs at least one user")
    if target_epsilon is None and noise is None:
        raise ConfigError("target_epsilon", "a DP release needs target_epsilon or dp_noise")
    if target_epsilon is not None and not (0 < target_epsilon < math.inf):
        raise ConfigError("target_epsilon", f"must be a number > 0, got {target_epsilon}")
    if noise is not None and not (0 < noise < math.inf):
        raise ConfigError("dp_noise", f"must be a number > 0, got {noise}")
    delta = 1.0 / n_users if delta is None else delta
    if not 0 < delta < 1:
        raise ConfigError("dp_delta", f"must be in (0, 1), got {delta}")
    field = "dp_noise" if noise is not None else "target_epsilon"
    try:
        if noise is None:
            assert target_epsilon is not None
            noise = calibrate_release(target_epsilon, delta)
        eps = release_epsilon(noise, delta)
    except (ArithmeticError, ValueError, NoBracketIntervalFoundError) as err:
        raise ConfigError(
            field,
            f"the privacy accountant cannot compute epsilon for this release (dp_noise "
            f"{noise}, target_epsilon {target_epsilon}, delta {delta:g}): "
            f"{type(err).__name__}: {err}",
        ) from None
    if target_epsilon is not None and eps > target_epsilon:
        raise ConfigError(
            "target_epsilon",
            f"dp_noise {noise:g} spends epsilon {eps:.4g} > {target_epsilon:g} at delta "
            f"{delta:g}; a larger noise multiplier, or no dp_noise to calibrate it",
        )
    return CountRelease(max_items, float(noise), delta, eps, target_epsilon)


def noisy_counts(split: Split, release: CountRelease, seed: int) -> np.ndarray:
    """The released count vector: bounded counts plus N(0, (z*sqrt(k))^2) on every item."""
    counts = split_bounded_counts(split, release.max_items, seed).astype(np.float64)
    rng = np.random.default_rng([int(seed), _NOISE_KEY])
    return counts + rng.normal(0.0, release.noise_std, size=split.n_items)


def dp_popularity(split: Split, release: CountRelease, seed: int = 0) -> RunResult:
    """Rank every user's candidates by the noisy counts of ``release`` (seeded by ``seed``);
    the result carries the release as its ``privacy`` and its epsilon on its one record."""
    scores = torch.from_numpy(noisy_counts(split, release, seed))
    res = _fixed_ranking(split, lambda _u, cand: scores[torch.from_numpy(cand)], "popularity")
    res.config.update(seed=seed, dp_max_items=release.max_items)
    res.privacy = release.to_json()
    res.rounds[0].epsilon = release.epsilon
    return res
