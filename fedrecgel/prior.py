"""The popularity prior: the served ranking is the model's logit plus w * log(1 + n_i).

n_i is how many training rows hold item i (the counts :func:`fedrecgel.baselines.popularity`
ranks by). The model learns popularity only as far as its regularised item embeddings can hold
it; the prior adds it back as a fixed item bias, the way a production ranker adds a
log-popularity term (`bench/popularity_prior.py` measures it on every data set).

w is chosen on the validation items at every evaluation among :data:`PRIOR_WEIGHTS`: 0 (the
model alone) unless a weight moves clearly more validation users into the served list than out
of it (a sign test, :data:`GUARD_Z`), then the one that moves the most. The run's round is
chosen on the model's own validation figure (:meth:`fedrecgel.simulate.RunResult.selected`), so
the prior never changes which model is served, only how its scores are ranked.

"Into the served list" is judged on the sampled candidates at the cut-off that stands for a
top :data:`SERVED_K` of the whole catalogue (:func:`guard_k`): with C candidates among N items a
held-out item in the catalogue's top 10 is in about the top 10 * C / N of its candidates, under
one place when N is over ten times C. Chosen on the sampled HR@10 instead, the weight rewarded
a push towards popular items that a sampled negative (most often an item few users hold) does
not resist and the whole catalogue does: on Amazon-Video that weight lowered the served
full-catalogue HR@10 by 0.9 points below the model's own (`bench/full_ranking.py`).

Metric sums carry the model's own figures under their plain names and each weight's under
``prior@W/NAME`` (with its sign test's ``gain`` and ``loss`` counts); :func:`choose` turns a
round's test and validation means into the served figures and the model's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:  # annotations only: the recommendation API imports this without the loaders
    from fedrecgel.accountant import PrivacyPlan
    from fedrecgel.data import Split

#: weights of the prior tried at each evaluation; 0 (the model alone) first, so it wins ties
PRIOR_WEIGHTS: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
#: the length of the served list the weight is chosen for (a top 10 of the whole catalogue)
SERVED_K = 10
#: the name of the rule that chooses the weight, recorded in benchmark results beside the
#: served figures it chose (results without it chose on the sampled validation HR@10)
CHOICE = "net gain at the served cut-off"
#: a weight is served only when the validation users it moves into the served list (at the
#: sampled cut-off :func:`guard_k`) outnumber those it moves out by this many standard
#: deviations of a sign test (gain - loss > Z * sqrt(gain + loss)): with few validation users a
#: weight that wins by chance stays off
GUARD_Z = 2.0
#: the metric names that only guard the choice, not reported
GUARD_NAMES = ("gain", "loss")
#: the key of a user's draw of the items it counts under DP (:func:`user_draw`)
DRAW_KEY = 0xC0117
#: the key of the noise of a simulated DP run's count release (the services draw theirs from
#: the operating system's secret randomness)
RELEASE_KEY = 0xC0119


def guard_k(n_items: int, n_candidates: int) -> int:
    """The cut-off among ``n_candidates`` sampled candidates that stands for a top
    :data:`SERVED_K` of a catalogue of ``n_items``: SERVED_K * C / N rounded, at least 1 and at
    most SERVED_K (all of it when the candidates are the whole catalogue)."""
    share = round(SERVED_K * n_candidates / max(n_items, 1))
    return max(1, min(SERVED_K, share))


def item_counts(train_items: np.ndarray, n_items: int) -> np.ndarray:
    """How many training rows hold each item: (n_items,) int64."""
    return np.bincount(train_items, minlength=n_items).astype(np.int64)


def log_prior(counts: np.ndarray) -> Tensor:
    """log(1 + n_i) per item, float32 like the logits it is added to: (n_items,)."""
    return torch.from_numpy(np.log1p(counts.astype(np.float64))).to(torch.float32)


def split_prior(split: Split) -> Tensor | None:
    """The prior of ``split``'s training counts; None without validation items to choose its
    weight on."""
    if not split.has_validation:
        return None
    return log_prior(item_counts(split.train_items, split.n_items))


def user_draw(items: np.ndarray, max_items: int, seed: int, user: int) -> np.ndarray:
    """The items user ``user`` counts under DP: its distinct ``items``, or ``max_items`` of them
    drawn without replacement from the stream keyed by (``seed``, ``user``); sorted."""
    distinct = np.unique(items)
    if len(distinct) <= max_items:
        return distinct
    rng = np.random.default_rng([int(seed), DRAW_KEY, int(user)])
    return np.sort(rng.choice(distinct, size=max_items, replace=False))


def bounded_counts(
    held: Sequence[np.ndarray], users: Sequence[int], max_items: int, seed: int, n_items: int
) -> np.ndarray:
    """How many of ``users`` (their training items ``held``) count each item, each at most
    ``max_items`` distinct items (:func:`user_draw`): (n_items,) int64."""
    drawn = [user_draw(items, max_items, seed, u) for items, u in zip(held, users, strict=True)]
    flat = np.concatenate([np.zeros(0, dtype=np.int64), *drawn])
    return np.bincount(flat, minlength=n_items).astype(np.int64)


def split_bounded_counts(split: Split, max_items: int, seed: int) -> np.ndarray:
    """:func:`bounded_counts` of every user of ``split``."""
    users = range(split.n_users)
    held = [split.user_train(u) for u in users]
    return bounded_counts(held, users, max_items, seed, split.n_items)


def release_counts(counts: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """The counts a DP run ranks with: ``counts`` plus N(0, std^2) on every item (items nobody
    counted included), rounded to whole counts and at least 0 (post-processing): int64."""
    noisy = counts.astype(np.float64) + rng.normal(0.0, std, size=counts.shape)
    return np.maximum(np.rint(noisy), 0).astype(np.int64)


def run_prior(split: Split, enabled: bool, plan: PrivacyPlan | None, seed: int) -> Tensor | None:
    """The prior a simulated run ranks with from its start: None when ``enabled`` is false or
    without validation items (or, under sparse secure aggregation, until :class:`RoundPrior`
    fixes it); the training counts without DP; under DP the counts of ``plan``'s release
    (noise from the stream keyed by ``seed``), None when the plan releases none."""
    if not enabled or plan is None:
        return split_prior(split) if enabled else None
    if plan.prior_noise <= 0 or not split.has_validation:
        return None
    counts = split_bounded_counts(split, plan.prior_items, seed)
    rng = np.random.default_rng([int(seed), RELEASE_KEY])
    return log_prior(release_counts(counts, plan.prior_std, rng))


#: under sparse secure aggregation the prior is fixed once the rounds' counts have counted the
#: clients this many times over (on average): then it ranks as the exact counts do on FilmTrust,
#: Lastfm-2K and Amazon-Video, where once over it fell up to 1.5 points short on test
ROUND_COVER = 2


@dataclass(frozen=True)
class RoundCounts:
    """What a sparse secure round unmasks of its cohort's items (instance A): how many of its
    ``counted`` survivors hold each item outside the round's public ``pool``."""

    counts: np.ndarray
    pool: np.ndarray
    counted: int


class RoundPrior:
    """The popularity prior of a sparse secure run, from the counts its rounds unmask anyway
    (nothing more is revealed): item i's count over all clients is estimated as its summed
    counts times ``n_clients`` over the clients counted in rounds whose pool left i out; fixed
    once the rounds have counted ``ROUND_COVER * n_clients`` clients."""

    def __init__(self, n_items: int) -> None:
        self.counts = np.zeros(n_items, dtype=np.int64)
        self.exposure = np.zeros(n_items, dtype=np.int64)
        self.counted = 0

    def add(self, got: RoundCounts) -> None:
        """Take one round's counts."""
        self.counts += got.counts
        seen = np.full(len(self.exposure), got.counted, dtype=np.int64)
        seen[got.pool] = 0
        self.exposure += seen
        self.counted += got.counted

    def covers(self, n_clients: int) -> bool:
        """Whether the counts are enough to fix the prior."""
        return self.counted >= ROUND_COVER * n_clients

    def estimate(self, n_clients: int) -> np.ndarray:
        """Each item's estimated count over ``n_clients`` clients, rounded: (n_items,) int64."""
        rate = self.counts / np.maximum(self.exposure, 1)
        return np.rint(rate * n_clients).astype(np.int64)


def key(weight: float, name: str) -> str:
    """The metric name of ``name`` ranked with the prior at ``weight`` (0: the plain name)."""
    return name if weight == 0 else f"prior@{weight:g}/{name}"


def at_weight(metrics: dict[str, float], weight: float) -> dict[str, float]:
    """The plain-named metrics of the ranking with the prior at ``weight``."""
    if weight == 0:
        return {k: v for k, v in metrics.items() if not k.startswith("prior@")}
    head = key(weight, "")
    got = {k[len(head) :]: v for k, v in metrics.items() if k.startswith(head)}
    return {k: v for k, v in got.items() if k not in GUARD_NAMES}


@dataclass(frozen=True)
class Served:
    """One evaluation's figures: the served ranking's (at ``weight``) and the model's own."""

    test: dict[str, float]
    val: dict[str, float]
    #: the prior's weight chosen on validation; None when no prior was ranked
    weight: float | None
    model_test: dict[str, float]
    model_val: dict[str, float]


def moved(val: dict[str, float], weight: float) -> tuple[float, float]:
    """The shares of validation users ``weight`` moves into and out of the served list
    (``val``: means; 0 and 0 for the model alone, which holds no such figures)."""
    if weight == 0:
        return 0.0, 0.0
    gain, loss = (val.get(key(weight, g), 0.0) for g in GUARD_NAMES)
    return gain, loss


def clears_guard(val: dict[str, float], weight: float, n_val: int) -> bool:
    """Whether ``weight``'s gain over the model on the ``n_val`` validation users (``val``:
    means) passes the sign test of :data:`GUARD_Z`."""
    gain, loss = (n_val * share for share in moved(val, weight))
    return gain - loss > GUARD_Z * math.sqrt(gain + loss)


def net_gain(val: dict[str, float], weight: float) -> float:
    """The share of validation users ``weight`` moves into the served list less the share it
    moves out (``val``: means); 0 for the model alone."""
    gain, loss = moved(val, weight)
    return gain - loss


def choose(test: dict[str, float], val: dict[str, float], n_val: int) -> Served:
    """The served figures of a round: among the model alone and the weights that clear the
    guard (:func:`clears_guard`), the one with the largest validation :func:`net_gain` (the
    smallest such weight), with the test figures at that weight. Without prior figures (no
    prior, or no validation items to choose on) the model's figures are served, weight None."""
    model_test, model_val = at_weight(test, 0), at_weight(val, 0)
    tried = [w for w in PRIOR_WEIGHTS if w and key(w, "gain") in val and at_weight(test, w)]
    if not tried:
        return Served(model_test, model_val, None, model_test, model_val)
    sure = [0.0] + [w for w in tried if clears_guard(val, w, n_val)]
    best = max(sure, key=lambda w: net_gain(val, w))  # max keeps the first of a tie
    return Served(at_weight(test, best), at_weight(val, best), best, model_test, model_val)
