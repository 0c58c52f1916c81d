"""Client-level differential privacy of the uploads (DP-FedAvg, McMahan et al. 2018).

A client's upload is its whole shared part (item-table rows and score network) taken as ONE
vector. The client clips it to L2 norm ``C`` (:func:`clip_update`); the round's released
gradient is the SUM of the clipped uploads plus Gaussian noise of standard deviation ``z*C``
on every coordinate, divided by a public denominator (:func:`noisy_mean`):

* central DP: the server adds the noise to the sum (:class:`GaussianMean`);
* distributed DP: each client adds its share ``z*C/sqrt(m)`` (:func:`add_local_noise`), so
  the m shares sum to ``z*C`` and the server adds none (meant for secure aggregation, where
  the server only ever sees the sum).

Noise goes on EVERY row of every item table, rows no client touched included: noise only on
touched rows would reveal which rows were touched. A locally noised upload therefore carries
all rows (dense item tables). The denominator is the planned cohort size (``m`` for
fixed-size sampling, ``q*n`` for Poisson sampling), never the number of uploads that arrived,
which is not public.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.accountant import PrivacyPlan
from fedrecgel.model import ITEM_TABLES
from fedrecgel.strategy import Strategy, Wrapped, clip_update, update_norm
from fedrecgel.uploads import Update

#: relative slack of the server's norm check (float32 rounding of the client's scaling)
NORM_TOLERANCE = 1e-4
#: a locally noised upload's norm is refused beyond C + sigma*(sqrt(D) + this): for Gaussian
#: noise, P(||noise|| > sigma*(sqrt(D) + t)) <= exp(-t*t/2), here below 1e-21
NOISE_TAIL = 10.0


def add_local_noise(
    u: Update, sigma: float, shapes: dict[str, tuple[int, ...]], generator: torch.Generator
) -> Update:
    """``u`` plus N(0, sigma^2) on every coordinate of the shared part: item tables become dense
    (every row carries noise, so the rows a client touched do not show)."""
    rows: dict[str, tuple[Tensor, Tensor]] = {}
    for name, (idx, vals) in u.rows.items():
        full = torch.zeros(shapes[name])
        full.index_add_(0, idx, vals)
        full += sigma * torch.randn(shapes[name], generator=generator)
        rows[name] = (torch.arange(shapes[name][0], dtype=torch.int64), full)
    dense = {k: g + sigma * torch.randn(g.shape, generator=generator) for k, g in u.dense.items()}
    return Update(u.client_id, u.n_samples, rows, dense, u.loss)


def n_coordinates(shapes: dict[str, tuple[int, ...]]) -> int:
    """How many numbers the shared part holds."""
    return sum(math.prod(s) for s in shapes.values())


def norm_bound(clip: float, local_sigma: float, shapes: dict[str, tuple[int, ...]]) -> float:
    """The largest norm an honest upload has: C (plus the local noise's tail bound)."""
    bound = clip * (1.0 + NORM_TOLERANCE)
    if local_sigma > 0:
        bound += local_sigma * (math.sqrt(n_coordinates(shapes)) + NOISE_TAIL)
    return bound


def sum_updates(updates: Sequence[Update], shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """The plain sum of the uploads, densified, added in client-id order."""
    out = {name: torch.zeros(shape) for name, shape in shapes.items()}
    for u in sorted(updates, key=lambda u: u.client_id):
        for name, (idx, vals) in u.rows.items():
            out[name].index_add_(0, idx, vals)
        for name, g in u.dense.items():
            out[name].add_(g)
    return out


def noisy_mean(
    total: dict[str, Tensor], denominator: float, sigma: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """(total + N(0, sigma^2) on every coordinate) / denominator; ``total`` is not modified."""
    if denominator <= 0:
        raise ValueError("the denominator must be positive")
    out = {}
    for name, t in total.items():
        noisy = t + sigma * torch.randn(t.shape, generator=generator) if sigma > 0 else t.clone()
        out[name] = noisy / denominator
    return out


def secret_generator() -> torch.Generator:
    """A generator seeded from the operating system's secret randomness (the aggregator's:
    noise derived from the public run seed could be subtracted by anyone)."""
    return torch.Generator().manual_seed(secrets.randbits(63))


def seeded_generator(seed: int, *key: int) -> torch.Generator:
    """A generator keyed by the run seed (the simulator's: reproducible, NOT private)."""
    state = np.random.SeedSequence([int(seed), 0xD9, *map(int, key)]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]) & ((1 << 63) - 1))


class AdaptiveClip:
    """Adaptive clipping (Andrew et al. 2021): the clip norm C follows a quantile of the
    cohorts' upload norms, estimated under the run's privacy budget.

    Each client reports whether its upload's norm was within the round's C (as +1/2 or -1/2);
    the server adds N(0, ``count_sigma``^2) to their sum, divides it by the public denominator
    and adds 1/2: a noisy share b of the cohort within C. Then C <- C * exp(-lr * (b -
    quantile)): C shrinks while more than the quantile fit and grows while fewer do. C for
    round t+1 depends on released values only, so the rounds compose as before; the plan's
    sum noise z_s (:attr:`fedrecgel.accountant.PrivacyPlan.sum_noise`) leaves room for the
    count's noise in the same budget.
    """

    #: step of the geometric update (the paper's)
    LR = 0.2

    def __init__(self, plan: PrivacyPlan, generator: torch.Generator, lr: float = LR) -> None:
        assert plan.clip_quantile is not None
        self.clip = plan.clip
        self.quantile = plan.clip_quantile
        self.count_sigma = plan.count_sigma
        self.denominator = plan.denominator
        self.lr = lr
        self.generator = generator
        #: the noisy share within C of the last update (None before the first)
        self.share: float | None = None

    def update(self, within: int, reports: int) -> float:
        """The next C from ``within`` of ``reports`` clients within the current one."""
        noise = self.count_sigma * float(torch.randn((), generator=self.generator))
        self.share = (within - reports / 2.0 + noise) / self.denominator + 0.5
        self.clip *= math.exp(-self.lr * (self.share - self.quantile))
        return self.clip


class GaussianMean(Wrapped):
    """Central DP: the inner strategy's optimizer step on (sum + N(0, (z*C)^2)) / denominator.

    ``noise_std`` is z*C for central DP and 0 for distributed DP (the clients added theirs).
    Every upload must already be within ``bound`` (the clients clip; the server refused any
    upload beyond it): this checks it again and raises ValueError otherwise. With ``adaptive``
    clipping both follow its current C: noise ``noise_multiplier`` * C, bound C.
    """

    def __init__(
        self,
        inner: Strategy,
        bound: float,
        noise_std: float,
        denominator: float,
        generator: torch.Generator,
        adaptive: AdaptiveClip | None = None,
        noise_multiplier: float = 0.0,
        frozen: tuple[str, ...] = (),
    ) -> None:
        self.inner = inner
        self.frozen = frozen
        self.bound = bound
        self.noise_std = noise_std
        self.denominator = denominator
        self.generator = generator
        self.adaptive = adaptive
        self.noise_multiplier = noise_multiplier

    def aggregate(
        self,
        updates: Sequence[Update],
        shapes: dict[str, tuple[int, ...]],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """Noisy mean of the uploads over the public ``cohort_size`` (the planned one if None)."""
        if self.adaptive is not None:
            self.bound = norm_bound(self.adaptive.clip, 0.0, shapes)
            self.noise_std = self.noise_multiplier * self.adaptive.clip
        for u in updates:
            if update_norm(u) > self.bound:
                raise ValueError(f"client {u.client_id}: upload norm beyond {self.bound:g}")
            if any(n in self.frozen for n in (*u.rows, *u.dense)):
                raise ValueError(f"client {u.client_id}: an upload of a fixed parameter")
        denominator = self.denominator if cohort_size is None else cohort_size
        released = {n: s for n, s in shapes.items() if n not in self.frozen}
        mean = noisy_mean(
            sum_updates(updates, released), denominator, self.noise_std, self.generator
        )
        # the fixed parameters take no step and carry no noise: nothing of them is released
        return {**{n: torch.zeros(s) for n, s in shapes.items() if n in self.frozen}, **mean}


def with_privacy(
    inner: Strategy,
    plan: PrivacyPlan,
    shapes: dict[str, tuple[int, ...]],
    generator: torch.Generator,
) -> GaussianMean:
    """The DP strategy of a run's ``plan`` around its optimizer strategy ``inner`` (its norm
    check: C in central mode; in distributed mode the server's ingest checks the bound of
    each round's noise share)."""
    adaptive = None
    if plan.clip_quantile is not None:
        # the count's noise: a stream of its own, seeded from the run's
        seed = int(torch.randint(0, 1 << 62, (), generator=generator))
        adaptive = AdaptiveClip(plan, torch.Generator().manual_seed(seed ^ 0xC11F))
    return GaussianMean(
        inner,
        norm_bound(plan.clip, 0.0, shapes) if plan.mode == "central" else math.inf,
        plan.server_sigma,
        plan.denominator,
        generator,
        adaptive,
        plan.sum_noise,
        tuple(n for n in frozen_names(plan) if n in shapes),
    )


def frozen_names(plan: PrivacyPlan) -> tuple[str, ...]:
    """The shared parameters a run's plan keeps fixed: the item tables when they start from a
    release of the item co-occurrence (``item_noise`` > 0), else none."""
    return ITEM_TABLES if plan.item_noise > 0 else ()


@dataclass(frozen=True)
class ClientPrivacy:
    """What a client does to its upload in a DP run: clip to ``clip``, then (distributed DP)
    add N(0, ``local_sigma``^2) on every coordinate."""

    clip: float
    local_sigma: float = 0.0
    #: adaptive clipping: each client also reports whether its upload was within ``clip``
    report_within: bool = False
    #: shared parameters the run keeps fixed (spectral item tables): left out of every upload
    frozen: tuple[str, ...] = ()

    @staticmethod
    def of(plan: PrivacyPlan) -> ClientPrivacy:
        """A run plan's client side (the simulator's: its planned denominator)."""
        return ClientPrivacy(
            plan.clip, plan.local_sigma, plan.clip_quantile is not None, frozen_names(plan)
        )

    @staticmethod
    def announced(clip: float, noise: float | None, mode: str, cohort_size: int) -> ClientPrivacy:
        """A worker's, from the announced run config and round: its share of the noise is
        z*C/sqrt(the round's cohort size), so the cohort's shares sum to std z*C."""
        if mode != "distributed" or not noise or cohort_size < 1:
            return ClientPrivacy(clip)
        return ClientPrivacy(clip, noise * clip / math.sqrt(cohort_size))


def privatize(
    uploads: Sequence[Update],
    dp: ClientPrivacy,
    shapes: dict[str, tuple[int, ...]],
    generators: Sequence[torch.Generator],
) -> tuple[list[Update], np.ndarray]:
    """The clients' side: each upload clipped to C, then (distributed DP) noised with its
    share from its own generator (one per upload); and whether each upload was within C
    (what adaptive clipping reports), from the same norm the clipping used."""
    out = []
    within = np.zeros(len(uploads), dtype=bool)
    for k, (u, gen) in enumerate(zip(uploads, generators, strict=True)):
        if dp.frozen:  # fixed parameters are not uploaded: the clip norm is all the network's
            rows = {n: r for n, r in u.rows.items() if n not in dp.frozen}
            dense = {n: g for n, g in u.dense.items() if n not in dp.frozen}
            u = Update(u.client_id, u.n_samples, rows, dense, u.loss)
        norm = update_norm(u)
        within[k] = norm <= dp.clip
        c = clip_update(u, dp.clip, norm)
        if dp.local_sigma > 0:
            c = add_local_noise(c, dp.local_sigma, shapes, gen)
        out.append(c)
    return out, within
