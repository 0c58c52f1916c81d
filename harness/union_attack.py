"""What a server learns across rounds from the items each round's cohort holds.

Sparse secure aggregation (:func:`fedrecgel.secagg.aggregate.secure_sparse_mean`) unmasks, in
every round, how many of the cohort hold each item outside the round's negative pool (instance
A), and lays out the union of those items in instance B; a dense round with a negative pool
shows the same union as the item rows of its sum that are not zero. The server chose the
cohort, so it knows who was in each round. Whoever holds an item is in every round whose union
holds it; an item's union membership over the rounds is therefore a test each user either
passes (it was in no round without the item) or fails. :func:`attribute` applies that test to
every (user, item): a user's items always pass it, and an item held by one user alone ends up
passed by that user alone once the rounds have told the others apart.

:func:`observe` gives each round's cohort, pool and counts as a run draws them
(:func:`fedrecgel.cohort.select_cohort`, :func:`fedrecgel.sam.negative_pool`), the counts from
the protocol's own instance A for the first ``protocol_rounds`` rounds (checked equal to the
plain count) and from the plain count after them; :func:`observe_dense` gives a dense round's nonzero rows when
negatives are drawn from the whole catalogue.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fedrecgel.cohort import select_cohort
from fedrecgel.config import RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.sam import client_rng, negative_pool
from fedrecgel.sampling import cohort_samples
from fedrecgel.secagg.aggregate import counts_spec
from fedrecgel.secagg.local import secure_sum


@dataclass(frozen=True)
class Observed:
    """One round as the server sees it: the cohort it drew, the public pool and instance A's
    unmasked counts (the items outside the pool that many of the cohort hold)."""

    round_id: int
    cohort: np.ndarray
    pool: np.ndarray
    counts: np.ndarray


def holdings(held: Sequence[np.ndarray], n_items: int) -> np.ndarray:
    """(users, items) bool: whether each user holds each item."""
    out = np.zeros((len(held), n_items), dtype=bool)
    for u, items in enumerate(held):
        out[u, items] = True
    return out


def observe(
    held: Sequence[np.ndarray],
    n_items: int,
    params: RunParams,
    rounds: int,
    protocol_rounds: int = 0,
) -> Iterator[Observed]:
    """Rounds 1..``rounds`` of a run with ``params`` over users 0..len(held)-1 (``held``: each
    one's training items). The first ``protocol_rounds`` rounds' counts are what instance A
    unmasks (every client masks its indicator; AssertionError unless the result is the plain
    count); the rest are the plain count, which that equality vouches for."""
    if params.negative_pool is None:
        raise ValueError("the union of a round is over the items outside its negative pool")
    truth = holdings(held, n_items)
    users = np.arange(len(held), dtype=np.int64)
    model = ModelConfig(n_items=n_items)
    for r in range(1, rounds + 1):
        cohort = select_cohort(
            users, params.fraction, params.seed, r, 0, params.sampling, params.cohort_groups
        )
        pool = negative_pool(params.seed, r, n_items, params.negative_pool)
        counts = truth[cohort].sum(axis=0).astype(np.int64)
        counts[pool] = 0
        if r <= protocol_rounds:
            spec = counts_spec(model, params, r, [int(c) for c in cohort])
            inputs = {int(c): _outside(truth[c], pool) for c in cohort}
            unmasked = np.rint(secure_sum(spec, inputs).outcome.total).astype(np.int64)
            assert np.array_equal(unmasked, counts), "instance A's sum is not the plain count"
        yield Observed(r, cohort, pool, counts)


def observe_dense(
    held: Sequence[np.ndarray], n_items: int, params: RunParams, rounds: int
) -> Iterator[Observed]:
    """Rounds 1..``rounds`` of a dense secure run without a pool: each round's ``counts`` are
    1 on the item rows of the sum that are not zero, the rows some cohort member's samples
    touch (its positives, and its negatives drawn uniformly as a training round draws them:
    :func:`fedrecgel.sampling.cohort_samples` on each client's own stream); no pool."""
    users = np.arange(len(held), dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    for r in range(1, rounds + 1):
        cohort = select_cohort(
            users, params.fraction, params.seed, r, 0, params.sampling, params.cohort_groups
        )
        streams = [client_rng(params.seed, r, int(u)) for u in cohort]
        pos = [held[int(u)] for u in cohort]
        samples = cohort_samples(pos, n_items, params.n_negatives, streams)
        touched = np.zeros(n_items, dtype=np.int64)
        for items, _ in samples:
            touched[items] = 1
        yield Observed(r, cohort, none, touched)


def _outside(holds: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """A client's input to instance A: its 0/1 holdings with the pool's items zeroed."""
    x = np.asarray(holds, dtype=np.float64).copy()
    x[pool] = 0.0
    return x


class Attribution:
    """The server's running test of every (user, item) against the rounds it has seen."""

    def __init__(self, n_users: int, n_items: int) -> None:
        #: not yet failed: the user was in no round whose union lacked the item
        self.passed = np.ones((n_users, n_items), dtype=bool)
        #: tested: the user was in some round where the item was outside the pool
        self.tested = np.zeros((n_users, n_items), dtype=bool)

    def add(self, obs: Observed) -> None:
        """Take one round into account."""
        in_union = obs.counts > 0
        open_ = np.ones(len(in_union), dtype=bool)
        open_[obs.pool] = False  # the pool's items: the round says nothing of them
        self.passed[obs.cohort] &= in_union | ~open_
        self.tested[obs.cohort] |= open_

    def suspects(self) -> np.ndarray:
        """(users, items) bool: the pairs the rounds point to."""
        return self.passed & self.tested


def attribute(observed: Sequence[Observed], n_users: int, n_items: int) -> np.ndarray:
    """(users, items) bool: which user the rounds ``observed`` point to for each item."""
    att = Attribution(n_users, n_items)
    for obs in observed:
        att.add(obs)
    return att.suspects()


def scores(suspects: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """How far ``suspects`` reveal ``truth``: precision and recall over (user, item) pairs,
    and for items held by one user alone (``single_items`` of them) the share the rounds point
    to that user and nobody else (``single_named``), with the mean number of users they point
    to for each (``single_suspects``)."""
    hit = int((suspects & truth).sum())
    holders = truth.sum(axis=0)
    single = np.flatnonzero(holders == 1)
    named = suspects[:, single].sum(axis=0)
    exact = (named == 1) & suspects[truth[:, single].argmax(axis=0), single]
    return {
        "precision": hit / max(int(suspects.sum()), 1),
        "recall": hit / max(int(truth.sum()), 1),
        "single_items": float(len(single)),
        "single_named": float(exact.mean()) if len(single) else float("nan"),
        "single_suspects": float(named.mean()) if len(single) else float("nan"),
    }
