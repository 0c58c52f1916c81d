"""A round's mean gradient through secure aggregation, for the in-process simulator.

Each client's upload is clipped when the run clips (on the client: the server cannot clip what
it cannot see), laid out (:mod:`.layout`), fixed-point encoded and masked; the server unmasks
only the sum of the survivors and divides by their count. The result equals plain aggregation
(:func:`fedrecgel.strategy.aggregate_gradients`, ``mean`` weighting) to within the fixed-point
step.

``secure_aggregation=dense`` (:func:`secure_mean`) lays out every item row, in 64-bit words.
``secure_aggregation=sparse`` (:func:`secure_sparse_mean`, needs ``negative_pool``: every
client's negatives are items of the round's public pool) runs two protocol instances, each
with its own fresh mask keys, seeds and shares (:class:`~fedrecgel.secagg.protocol.Client`
draws them per instance: revealing a survivor's self-mask seed in one and the mask key of the
same client, dropped, in the other exposes nothing, as the two share no secret that is ever
revealed; only the key that encrypts the shares, never revealed, serves both):

* **A, counts**: each client masks the 0/1 indicator, over the catalogue, of the item rows its
  upload touches outside the pool (its positives outside the pool: its negatives are pool
  items), in words of the fewest bits that hold the cohort's count (8 for up to 127 clients,
  else 16, else 32). The server learns how many of A's survivors hold each such item: an
  aggregate over the cohort, not which client holds it. Across rounds it is more: the server
  drew every cohort, and whoever holds an item is in every round whose union holds it, so a
  run's rounds name who holds an item held by one client alone (every such item by round
  300 of a default run, ``bench/secagg_union.py``; a dense round with a pool shows the same
  union as its sum's nonzero rows). Cohorts of whole groups (``cohort_groups``) leave the
  server the holder's group, not the holder.
* **B, the update**: the union U (items counted in A, plus the pool; sorted, public) is the
  only item rows laid out, with the score network and the loss slot. B's cohort is A's (over
  HTTP both instances' keys and shares are dealt before A's inputs: :func:`carried_into_b`
  gives the in-process round the same dropouts), and only A's survivors send an input (a
  client dropped from A may hold items outside U; it counts as dropped in B); every row each
  touches is in U by construction (:func:`~fedrecgel.secagg.layout.flatten` refuses
  otherwise). Its words are 32 bits, at the finest step whose sum over B's cohort cannot
  wrap given ``secagg_range`` (:meth:`~fedrecgel.fixedpoint.FixedPoint.finest`, at most
  ``secagg_scale_bits``; at least :data:`MIN_SPARSE_SCALE`). The mean is over B's survivors.

Range and scale of B. 32 bits hold ``n * range * 2^scale < 2^31`` for a cohort of n: with the
default range 16 and FilmTrust's 122 clients the scale is 20 (step 9.5e-7), Amazon-Video's 807
gives 17. The score network's per-client gradients reach 2.5 and the loss slot 5.5 on
FilmTrust, so the range stays 16 for them; the item rows' reach only 0.023 (median 7e-5, a
tenth of them below 3e-6), which a step of 1e-6 would erase. So the item rows are encoded
:data:`ROW_GAIN_BITS` finer: multiplied by 2^8 before encoding (their range is
``secagg_range`` / 256 = 0.0625, beyond it they are clipped and counted like any value) and
divided after decoding; a word's largest magnitude, hence the overflow bound, is the same for
every value. The mean's error is at most half a step: 2^-(scale+9) on the rows, 2^-(scale+1)
elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from torch import Tensor

from fedrecgel.config import RunParams
from fedrecgel.fixedpoint import FixedPoint, OverflowRefused
from fedrecgel.model import ModelConfig
from fedrecgel.sam import negative_pool
from fedrecgel.secagg.layout import flatten, row_values, unflatten, vector_length
from fedrecgel.secagg.local import Faults, secure_sum
from fedrecgel.secagg.protocol import RoundSpec
from fedrecgel.strategy import clip_update
from fedrecgel.uploads import Update

#: the words of sparse secure aggregation's update instance (B)
SPARSE_WORD_BITS = 32
#: the coarsest step B may take (2^-8): a larger cohort or range is refused
MIN_SPARSE_SCALE = 8
#: B encodes item rows this many bits finer than the rest (their range that much narrower)
ROW_GAIN_BITS = 8


@dataclass(frozen=True)
class SecureMean:
    """The unmasked mean of a round, who it is over, and how many values were clipped."""

    grads: dict[str, Tensor]
    loss: float
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    clipped: int


@dataclass(frozen=True)
class SparseMean:
    """A sparse secure round: its mean (over B's survivors), the union of rows B laid out,
    the per-item counts A revealed (over A's survivors) outside the round's ``pool`` and both
    instances' public specs."""

    mean: SecureMean
    union: np.ndarray
    counts: np.ndarray
    counted: tuple[int, ...]
    specs: tuple[RoundSpec, RoundSpec]
    pool: np.ndarray


def round_spec(
    cfg: ModelConfig,
    params: RunParams,
    round_id: int,
    cohort: Sequence[int],
    length: int | None = None,
    fixed: FixedPoint | None = None,
    instance: str = "a",
) -> RoundSpec:
    """The public parameters of round ``round_id`` of a run (the ring is keyed by its seed);
    by default a dense round's (:func:`vector_length` values, the run's 64-bit encoding)."""
    return RoundSpec(
        round_id=round_id,
        cohort=tuple(sorted(int(c) for c in cohort)),
        length=vector_length(cfg) if length is None else length,
        fixed=params.secagg_fixed_point() if fixed is None else fixed,
        neighbours=params.secagg_neighbours,
        dropout=params.secagg_dropout,
        graph_seed=params.seed,
        instance=instance,
    )


def _clipped(params: RunParams, u: Update) -> Update:
    return clip_update(u, params.clip) if params.clip is not None else u


def secure_mean(
    cfg: ModelConfig,
    params: RunParams,
    round_id: int,
    updates: Sequence[Update],
    faults: Faults | None = None,
) -> SecureMean:
    """The mean of ``updates`` as the server of a secure-aggregation round computes it."""
    by_id = {u.client_id: u for u in updates}
    spec = round_spec(cfg, params, round_id, list(by_id))
    r = secure_sum(spec, lambda cid: flatten(cfg, _clipped(params, by_id[cid])), faults)
    out = r.outcome
    grads, loss = unflatten(cfg, out.total / len(out.survivors))
    return SecureMean(grads, loss, out.survivors, out.dropped, r.clipped)


def counting_ring(n: int) -> FixedPoint:
    """The narrowest ring that sums ``n`` 0/1 indicators exactly."""
    for bits in (8, 16, 32):
        if FixedPoint(1.0, 0, bits).max_cohort() >= n:
            return FixedPoint(1.0, 0, bits)
    raise OverflowRefused(f"a cohort of {n} clients is too large to count in 32-bit words")


def sparse_fixed_point(params: RunParams, n: int) -> FixedPoint:
    """B's encoding for a cohort of ``n``: 32-bit words, the finest scale (at most
    ``secagg_scale_bits``) whose sum cannot wrap; :class:`OverflowRefused` below 2^-8."""
    fp = FixedPoint.finest(params.secagg_range, n, SPARSE_WORD_BITS, params.secagg_scale_bits)
    if fp.scale_bits < MIN_SPARSE_SCALE:
        raise OverflowRefused(
            f"secure_aggregation=sparse: a cohort of {n} with secagg_range "
            f"{params.secagg_range:g} leaves a step of 2^-{fp.scale_bits} in 32-bit words, "
            f"coarser than 2^-{MIN_SPARSE_SCALE}: lower secagg_range"
        )
    return fp


def row_gain(cfg: ModelConfig, union: np.ndarray) -> np.ndarray:
    """B's public per-value factor before encoding: 2^ROW_GAIN_BITS on the item rows, else 1."""
    gain = np.ones(vector_length(cfg, union), dtype=np.float64)
    gain[: row_values(cfg, union)] = 2.0**ROW_GAIN_BITS
    return gain


def item_indicator(cfg: ModelConfig, u: Update, pool: np.ndarray) -> np.ndarray:
    """A's input of a client: 1 on the item rows its upload touches outside the pool."""
    x = np.zeros(cfg.n_items, dtype=np.float64)
    for idx, _ in u.rows.values():
        x[idx.numpy()] = 1.0
    x[pool] = 0.0
    return x


def counts_spec(
    cfg: ModelConfig, params: RunParams, round_id: int, cohort: Sequence[int]
) -> RoundSpec:
    """Instance A's public parameters: the catalogue's indicators, counted exactly."""
    return round_spec(cfg, params, round_id, cohort, cfg.n_items, counting_ring(len(cohort)))


def update_spec(
    cfg: ModelConfig, params: RunParams, round_id: int, cohort: Sequence[int], union: np.ndarray
) -> RoundSpec:
    """Instance B's public parameters: the rows of ``union``, 32-bit words."""
    fixed = sparse_fixed_point(params, len(cohort))
    return round_spec(cfg, params, round_id, cohort, vector_length(cfg, union), fixed, "b")


def sparse_input(cfg: ModelConfig, params: RunParams, u: Update, union: np.ndarray) -> np.ndarray:
    """B's input of a client: its (clipped) update on the rows of ``union``, times the gain
    (:func:`row_gain`, applied in place: 2^ROW_GAIN_BITS on the item rows), in float32 (the
    update's own precision; the gain, a power of two, is exact in it), which B's 32-bit
    encoding takes in one pass."""
    x = flatten(cfg, _clipped(params, u), union, np.float32)
    x[: row_values(cfg, union)] *= 2.0**ROW_GAIN_BITS
    return x


def round_pool(params: RunParams, n_items: int, round_id: int) -> np.ndarray:
    """The round's public negative pool of a run with ``negative_pool`` set."""
    if params.negative_pool is None:
        raise ValueError("sparse secure aggregation needs the run's negative_pool")
    return negative_pool(params.seed, round_id, n_items, params.negative_pool)


def union_of(counts: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """The public union U of a sparse round: the items counted in A, and the pool (sorted)."""
    return np.union1d(np.flatnonzero(counts), pool)


def carried_into_b(
    faults_a: Faults, faults_b: Faults, cohort: Sequence[int], survivors_a: Sequence[int]
) -> Faults:
    """B's faults with A's dropouts carried over, as over HTTP, where both instances' keys and
    shares travel in the same phases: a client without keys (or shares) in A has none in B,
    and any other client of the cohort that is not one of A's survivors sends no input to B."""
    lost_keys, lost_shares = faults_a.no_keys, faults_a.no_shares
    silent = frozenset(cohort) - frozenset(survivors_a) - lost_keys - lost_shares
    return replace(
        faults_b,
        no_keys=faults_b.no_keys | lost_keys,
        no_shares=faults_b.no_shares | lost_shares,
        no_input=faults_b.no_input | silent,
    )


def secure_sparse_mean(
    cfg: ModelConfig,
    params: RunParams,
    round_id: int,
    updates: Sequence[Update],
    faults_a: Faults | None = None,
    faults_b: Faults | None = None,
) -> SparseMean:
    """The mean of ``updates`` as the server of a sparse secure-aggregation round computes it
    (``faults_a``/``faults_b``: who drops out of or misbehaves in instance A / B)."""
    pool = round_pool(params, cfg.n_items, round_id)
    by_id = {u.client_id: u for u in updates}
    spec_a = counts_spec(cfg, params, round_id, list(by_id))
    in_a = secure_sum(spec_a, lambda cid: item_indicator(cfg, by_id[cid], pool), faults_a)
    a = in_a.outcome
    counts = np.rint(a.total).astype(np.int64)
    union = union_of(counts, pool)
    spec_b = update_spec(cfg, params, round_id, list(by_id), union)
    faults_b = carried_into_b(
        faults_a or Faults(), faults_b or Faults(), spec_b.cohort, a.survivors
    )
    r = secure_sum(
        spec_b, lambda cid: sparse_input(cfg, params, by_id[cid], union), faults_b, in_a.clients
    )
    out = r.outcome
    total = out.total / row_gain(cfg, union)
    grads, loss = unflatten(cfg, total / len(out.survivors), union)
    mean = SecureMean(grads, loss, out.survivors, out.dropped, r.clipped)
    return SparseMean(mean, union, counts, a.survivors, (spec_a, spec_b), pool)
