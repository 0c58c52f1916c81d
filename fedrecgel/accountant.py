"""The privacy budget of a DP run, from Google's ``dp-accounting`` library (its RDP accountant).

One round releases the noisy mean of a sampled cohort's clipped uploads: a sampled Gaussian
mechanism, composed over the rounds. The DP event matches the cohort draw of
:mod:`fedrecgel.cohort`:

* ``poisson``: each client takes part independently with probability q = ``fraction``;
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add-or-remove-one-client neighbouring
  (the sum's sensitivity is C, the noise z*C);
* ``fixed``: m = int(fraction * n) clients uniformly without replacement;
  ``SampledWithoutReplacementDpEvent(n, m, GaussianDpEvent(z / 2))`` under replace-one-client
  neighbouring, where the sum's sensitivity is 2C, hence the noise multiplier z/2.

Epsilon is reported at delta (default 1/n, n the number of clients). A run given a target
epsilon either stops before the first round that would exceed it (``dp_noise`` set) or, with
no ``dp_noise``, gets the smallest z that keeps its ``rounds`` within the target
(calibrated with the library's ``calibrate_dp_mechanism``).

The DP popularity baseline (:mod:`fedrecgel.dp_popularity`) releases its noisy item counts once:
one ``GaussianDpEvent(z)`` under add-or-remove-one-user neighbouring (:func:`release_epsilon`,
:func:`calibrate_release`).

A DP run may make up to two releases before its rounds, each one Gaussian release calibrated so
that it alone spends its share of the target: the popularity prior's item counts
(``dp_prior_share``) and the item co-occurrence its item tables start from (``dp_item_share``,
:mod:`fedrecgel.item_spectrum`). Its plan carries their noise multipliers, every epsilon it
reports is that of the releases and the rounds composed (their RDP curves add), and the rounds'
noise is calibrated to what the composition leaves. Under replace-one neighbouring (fixed-size
cohorts) a user moves the counts by up to sqrt(2k) and the co-occurrence by up to sqrt(2), so a
release of noise multiplier z is ``GaussianDpEvent(z / sqrt(2))`` there.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import dp_accounting
import numpy as np
from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError
from dp_accounting.rdp import RdpAccountant, rdp_privacy_accountant

from fedrecgel.cohort import cohort_size
from fedrecgel.config import ConfigError, DPMode, RunParams, Sampling

# the library logs a warning for each RDP order its series leaves out (harmless, and many)
logging.getLogger("absl").setLevel(logging.ERROR)


def _event(
    z: float, sampling: Sampling, n: int, m: int, q: float, rounds: int
) -> dp_accounting.DpEvent:
    gaussian: dp_accounting.DpEvent
    if sampling == "poisson":
        gaussian = dp_accounting.GaussianDpEvent(z)
        one: dp_accounting.DpEvent = dp_accounting.PoissonSampledDpEvent(q, gaussian)
    else:
        gaussian = dp_accounting.GaussianDpEvent(z / 2.0)
        one = dp_accounting.SampledWithoutReplacementDpEvent(n, m, gaussian)
    return dp_accounting.SelfComposedDpEvent(one, rounds)


def _accountant(sampling: Sampling) -> RdpAccountant:
    rel = dp_accounting.NeighboringRelation
    return RdpAccountant(
        neighboring_relation=rel.ADD_OR_REMOVE_ONE if sampling == "poisson" else rel.REPLACE_ONE
    )


def epsilon_slow(
    z: float, sampling: Sampling, n: int, m: int, q: float, rounds: int, delta: float
) -> float:
    """:func:`epsilon` through the accountant's public compose/get_epsilon (one RDP
    computation per call: slow on a loaded machine)."""
    acc = _accountant(sampling)
    acc.compose(_event(z, sampling, n, m, q, rounds))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def _one_round_rdp(
    z: float, sampling: Sampling, n: int, m: int, q: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(orders, RDP of one round at each order), from the library's accountant."""
    acc = _accountant(sampling)
    acc.compose(_event(z, sampling, n, m, q, 1))
    return tuple(acc._orders), tuple(acc._rdp)


def _release_event(z: float, sampling: Sampling) -> dp_accounting.DpEvent:
    """One release before the rounds at noise multiplier ``z`` (the noise std over the L2
    sensitivity under add-or-remove), under the neighbouring relation of ``sampling``'s
    accountant."""
    return dp_accounting.GaussianDpEvent(z if sampling == "poisson" else z / math.sqrt(2.0))


@functools.lru_cache(maxsize=256)
def _release_rdp(releases: tuple[float, ...], sampling: Sampling) -> tuple[float, ...]:
    """The RDP of the releases at the orders of :func:`_one_round_rdp` (0 without any)."""
    acc = _accountant(sampling)
    for z in releases:
        acc.compose(_release_event(z, sampling))
    return tuple(acc._rdp) if releases else tuple(0.0 for _ in acc._orders)


@functools.lru_cache(maxsize=4096)
def epsilon(
    z: float,
    sampling: Sampling,
    n: int,
    m: int,
    q: float,
    rounds: int,
    delta: float,
    releases: tuple[float, ...] = (),
) -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of noise multiplier ``z`` (inf if z == 0),
    composed with one release of each noise multiplier in ``releases``.

    RDP composes additively: the one-round RDP curve is computed once and scaled by the
    number of rounds (plus the releases' curves), then converted with the library's
    ``compute_epsilon`` (the same conversion its accountant's ``get_epsilon`` makes; a test
    checks the two agree).
    """
    if rounds <= 0 and not releases:
        return 0.0
    if z <= 0 and rounds > 0:
        return math.inf
    orders, rdp = _one_round_rdp(z if z > 0 else 1.0, sampling, n, m, q)
    total = rounds * np.asarray(rdp) if rounds > 0 else np.zeros(len(orders))
    eps, _ = rdp_privacy_accountant.compute_epsilon(
        np.asarray(orders), total + np.asarray(_release_rdp(releases, sampling)), delta
    )
    return float(eps)


def calibrate(
    target: float,
    sampling: Sampling,
    n: int,
    m: int,
    q: float,
    rounds: int,
    delta: float,
    releases: tuple[float, ...] = (),
) -> float:
    """The smallest noise multiplier whose ``rounds`` rounds, after one release of each noise
    multiplier in ``releases``, stay within ``target`` epsilon."""

    def event(z: float) -> dp_accounting.DpEvent:
        rounds_event = _event(z, sampling, n, m, q, rounds)
        if not releases:
            return rounds_event
        before = [_release_event(r, sampling) for r in releases]
        return dp_accounting.ComposedDpEvent([*before, rounds_event])

    z = dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(sampling),
        event,
        target,
        delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-2, 1.0),
        tol=1e-4,
    )
    z = float(z)
    # Brent's method lands within tol of the boundary: step up until the target holds
    while epsilon(z, sampling, n, m, q, rounds, delta, releases) > target:
        z *= 1.0 + 1e-4
    return z


@dataclass(frozen=True)
class PrivacyPlan:
    """A DP run's clipping, noise, sampling, accounting and the rounds its budget allows."""

    clip: float
    noise: float  # the noise multiplier z (given, or calibrated from the target)
    mode: DPMode
    sampling: Sampling
    n_users: int
    cohort: int  # clients drawn per round (fixed-size), 0 under Poisson sampling
    q: float  # each client's probability of taking part in a round
    delta: float
    rounds: int  # rounds the run takes: its configured rounds, or fewer to stay within target
    target_epsilon: float | None
    #: adaptive clipping: the quantile of the upload norms C follows (``clip`` is the first C)
    clip_quantile: float | None = None
    #: the popularity prior's count release before the rounds: its noise multiplier (noise std
    #: prior_noise * sqrt(prior_items) on every item's count; 0: no release) and how many
    #: distinct training items each user counts at most
    prior_noise: float = 0.0
    prior_items: int = 0
    #: the release of the item co-occurrence the item tables start from (and stay at): its
    #: noise multiplier (0: none, the item tables are trained)
    item_noise: float = 0.0

    @property
    def denominator(self) -> float:
        """The public divisor of the noisy sum: m (fixed-size) or q*n (Poisson)."""
        return float(self.cohort) if self.sampling == "fixed" else self.q * self.n_users

    @property
    def count_sigma(self) -> float:
        """Adaptive clipping: the noise std on the count of clients within C, each counting
        +1/2 or -1/2: the denominator / 20 (Andrew et al. 2021), at least z."""
        return max(self.denominator / 20.0, self.noise)

    @property
    def sum_noise(self) -> float:
        """The noise multiplier of the sum. With adaptive clipping the round releases the sum
        (sensitivity C, noise z_s*C) and the count (sensitivity 1/2, noise s): together one
        Gaussian release of multiplier z when 1/z^2 = 1/z_s^2 + 1/(2s)^2, so
        z_s = (z^-2 - (2s)^-2)^(-1/2); without it, z."""
        if self.clip_quantile is None or self.noise <= 0:
            return self.noise
        return float((self.noise**-2 - (2.0 * self.count_sigma) ** -2) ** -0.5)

    @property
    def server_sigma(self) -> float:
        """Noise the server adds to the sum at the first C: z*C in central mode (z_s*C with
        adaptive clipping), none in distributed mode."""
        return self.sum_noise * self.clip if self.mode == "central" else 0.0

    @property
    def local_sigma(self) -> float:
        """Noise each client adds in distributed mode: z*C/sqrt(denominator)."""
        if self.mode != "distributed":
            return 0.0
        return self.noise * self.clip / math.sqrt(self.denominator)

    @property
    def prior_std(self) -> float:
        """The noise std on each item's released count: z_p * sqrt(k) (0 without a release)."""
        return self.prior_noise * math.sqrt(self.prior_items)

    @property
    def releases(self) -> tuple[float, ...]:
        """The noise multipliers of the releases before the rounds."""
        return tuple(z for z in (self.prior_noise, self.item_noise) if z > 0)

    def epsilon(self, rounds: int) -> float:
        """Epsilon at :attr:`delta` once ``rounds`` rounds were released (and the releases
        before them)."""
        return epsilon(
            self.noise,
            self.sampling,
            self.n_users,
            self.cohort,
            self.q,
            rounds,
            self.delta,
            self.releases,
        )


def rounds_within(plan: PrivacyPlan, target: float, most: int) -> int:
    """The largest r <= ``most`` with epsilon(r) <= ``target`` (epsilon grows with r)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan.epsilon(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_privacy(params: RunParams, n_users: int) -> PrivacyPlan | None:
    """The privacy plan of a run over ``n_users`` clients; None when the run is not DP.

    Raises :class:`ConfigError` when a target epsilon cannot be met by even one round.
    """
    if not params.dp_enabled:
        return None
    if n_users < 1:
        raise ConfigError("n_users", "a DP run needs at least one client")
    if params.sampling == "poisson":
        m, q = 0, params.fraction
    else:
        m = cohort_size(n_users, params.fraction)
        q = m / n_users
    delta = params.dp_delta if params.dp_delta is not None else 1.0 / n_users
    target = params.target_epsilon
    scale = 1.0 if params.sampling == "poisson" else math.sqrt(2.0)  # replace-one: sqrt(2) more
    z_p = z_g = 0.0
    try:
        if params.dp_prior_release:
            assert target is not None
            z_p = scale * calibrate_release(params.dp_prior_share * target, delta)
        if params.dp_item_release:
            assert target is not None
            z_g = scale * calibrate_release(params.dp_item_share * target, delta)
        releases = tuple(z for z in (z_p, z_g) if z > 0)
        if params.dp_noise is not None:
            z = params.dp_noise
        else:
            assert target is not None
            z = calibrate(target, params.sampling, n_users, m, q, params.rounds, delta, releases)
        # what every closed round reports: a setting the accountant cannot compute (a noise
        # multiplier whose square underflows, a delta too small for its series) is refused
        # here, not when the first round closes
        epsilon(z, params.sampling, n_users, m, q, 1, delta, releases)
        epsilon(z, params.sampling, n_users, m, q, params.rounds, delta, releases)
    except (ArithmeticError, ValueError, NoBracketIntervalFoundError) as err:
        field = "dp_noise" if params.dp_noise is not None else "target_epsilon"
        raise ConfigError(
            field,
            f"the privacy accountant cannot compute epsilon for this run (dp_noise "
            f"{params.dp_noise}, target_epsilon {target}, delta {delta:g}): "
            f"{type(err).__name__}: {err}",
        ) from None
    plan = PrivacyPlan(
        clip=params.dp_clip,
        noise=z,
        mode=params.dp_mode,
        sampling=params.sampling,
        n_users=n_users,
        cohort=m,
        q=q,
        delta=delta,
        rounds=params.rounds,
        target_epsilon=target,
        clip_quantile=params.dp_clip_quantile,
        prior_noise=z_p,
        prior_items=params.dp_prior_items if z_p > 0 else 0,
        item_noise=z_g,
    )
    if target is not None and params.dp_noise is not None:
        allowed = rounds_within(plan, target, params.rounds)
        if allowed < 1:
            raise ConfigError(
                "target_epsilon",
                f"one round with dp_noise {z:g} already spends epsilon "
                f"{plan.epsilon(1):.3g} > {target:g}",
            )
        plan = PrivacyPlan(**{**plan.__dict__, "rounds": allowed})
    return plan


def _one_release() -> RdpAccountant:
    return RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


@functools.lru_cache(maxsize=256)
def release_epsilon(z: float, delta: float) -> float:
    """Epsilon at ``delta`` of ONE Gaussian release of noise multiplier ``z`` (noise std z times
    the L2 sensitivity), add-or-remove-one neighbouring, by the library's RDP accountant (inf if
    z == 0)."""
    if z <= 0:
        return math.inf
    acc = _one_release()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    return float(acc.get_epsilon(delta))


def calibrate_release(target: float, delta: float) -> float:
    """The smallest noise multiplier of one Gaussian release that stays within ``target``."""
    z = float(
        dp_accounting.calibrate_dp_mechanism(
            _one_release,
            dp_accounting.GaussianDpEvent,
            target,
            delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-5,
        )
    )
    while release_epsilon(z, delta) > target:  # Brent's method lands within tol of the boundary
        z *= 1.0 + 1e-5
    return z
