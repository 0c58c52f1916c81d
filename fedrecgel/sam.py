"""The hierarchical SAM client step, computed for a whole cohort of clients at once.

For one client c with private parameters u_c and the round's shared parameters w (the
paper's round, README.md "What this is"):

1. pass 1: g_sh = dL/dw, g_ns = dL/du_c at (w, u_c)
2. pass 2: e_sh = rho_sh g_sh / (||g_sh|| + 1e-12); upload = dL/dw at (w + e_sh, u_c)
3. pass 3: e_ns = rho_ns g_ns / (||g_ns|| + 1e-12); g_ns^SAM = dL/du_c at (w, u_c + e_ns)
4. one Adam step on u_c with g_ns^SAM (per-client Adam state, private)

Clients of one round share w, so they are independent: here a group of clients is computed
together (:mod:`fedrecgel.passes`: their samples back to back, no padding, forward and
backward written out). Each client's item-row gradients are kept per (client, item) pair,
which is exactly the sparse item-row upload; its perturbed copy of the small dense score
network exists only in pass 2. Nothing of size clients x items is built, and the full item
tables are never copied. Per-client uploads are computed one client at a time (a client's
float rounding must not depend on its neighbours: the in-process simulator and a worker that
recomputes only its pending clients after a crash compute the same bytes); the aggregate
path takes groups of clients, and for NCF runs on :mod:`fedrecgel.native`'s compiled kernels
where they are built (the torch passes are the reference they are tested against).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fedrecgel import passes
from fedrecgel.allocator import keep_freed_memory
from fedrecgel.config import DEFAULTS
from fedrecgel.model import ModelConfig
from fedrecgel.native import ops as native
from fedrecgel.passes import Layout, SharedGrads, make_layout
from fedrecgel.private_steps import PrivateState as PrivateState  # re-exported
from fedrecgel.private_steps import adam_, fit_private_, groups_of
from fedrecgel.rows import repeated_in_row as repeats_by_sorting
from fedrecgel.uploads import PartialSum, Update


@dataclass(frozen=True)
class SAMConfig:
    """Client-side hyperparameters (defaults: what the reference code actually does)."""

    rho_sh: float = DEFAULTS.rho_sh
    rho_ns: float = DEFAULTS.rho_ns
    client_lr: float = DEFAULTS.client_lr
    n_negatives: int = DEFAULTS.n_negatives
    chunk_size: int = DEFAULTS.chunk_size
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    # Extra Adam steps on the client's private embeddings before the SAM step, with the round's
    # samples at the round's shared parameters: the user fits its embedding to the current
    # items, so that the shared gradient it uploads is a personalised one (0: the paper).
    local_steps: int = DEFAULTS.local_steps
    # Decoupled weight decay of the private embeddings at each private step (AdamW's rule).
    weight_decay: float = DEFAULTS.client_weight_decay
    # Cap on the samples of one group of clients computed together (a memory knob).
    max_batch_samples: int = 1 << 13
    # Per-client uploads computed for groups of clients together (as the aggregate path does):
    # several times faster, but a client's float rounding then depends on which clients share
    # its group, so only the same group recomputes the same bytes. Off: one client at a time.
    grouped_uploads: bool = False
    # Each round's negatives drawn from a public pool of this many items (None: the catalogue).
    negative_pool: int | None = DEFAULTS.negative_pool


def client_rng(seed: int, round_id: int, user_id: int) -> np.random.Generator:
    """The random stream of one client in one round, the same wherever it is computed."""
    return np.random.default_rng([int(seed), int(round_id), int(user_id)])


#: rows of negatives up to this wide are checked pair by pair, wider ones by sorting
PAIRWISE_NEGATIVES = 32


@functools.cache
def _before(n: int) -> np.ndarray:
    """(n, n) bool: column i comes before column j of a row of negatives."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def repeated_in_row(negs: np.ndarray) -> np.ndarray:
    """bool of ``negs``' shape: the value also appears earlier in its row. Narrow rows compare
    every pair (fastest for the usual few negatives); wide ones sort each row, since the pairs
    of 1,000 negatives take 1 MB a row (30 GiB for a FilmTrust cohort)."""
    n = negs.shape[1]
    if n <= PAIRWISE_NEGATIVES:
        repeated: np.ndarray = ((negs[:, :, None] == negs[:, None, :]) & _before(n)).any(axis=1)
        return repeated
    return repeats_by_sorting(negs)


#: the tag that keys a round's negative pool (public: every client and the server draw it)
POOL_TAG = 0x9E6


def negative_pool(seed: int, round_id: int, n_items: int, size: int) -> np.ndarray:
    """Round ``round_id``'s public pool of ``size`` distinct items (sorted int64), drawn from a
    generator keyed by the run's seed, the round and :data:`POOL_TAG` (four words, so no
    client's ``client_rng(seed, round, user)`` stream is the pool's)."""
    if not 1 <= size <= n_items:
        raise ValueError(f"a negative pool of {size} items from a catalogue of {n_items}")
    rng = np.random.default_rng([int(seed), int(round_id), POOL_TAG, 1])
    return np.sort(rng.choice(n_items, size=size, replace=False).astype(np.int64))


def check_drawable(
    positives: np.ndarray, n_items: int, n_negatives: int, pool: np.ndarray | None
) -> None:
    """ValueError when a client with ``positives`` cannot draw ``n_negatives`` distinct
    negatives from the catalogue (``pool`` None) or from the round's pool."""
    if pool is None:
        if n_items - len(positives) >= n_negatives:
            return
        left, where = n_items - len(np.unique(positives)), f"a catalogue of {n_items}"
    else:
        left = len(pool) - int(np.isin(pool, positives).sum())
        where = f"the round's negative pool of {len(pool)}"
    if left < n_negatives:
        raise ValueError(
            f"a client with {len(np.unique(positives))} items cannot draw {n_negatives} "
            f"negatives from {where} ({left} of them are not its items)"
        )


def draw_items(
    rng: np.random.Generator, n_items: int, pool: np.ndarray | None, size: int | tuple[int, int]
) -> np.ndarray:
    """Uniform items: from the whole catalogue, or from ``pool`` (one draw of ``rng`` each)."""
    if pool is None:
        return rng.integers(0, n_items, size=size)
    picked: np.ndarray = pool[rng.integers(0, len(pool), size=size)]
    return picked


def client_samples(
    positives: np.ndarray,
    n_items: int,
    n_negatives: int,
    rng: np.random.Generator,
    pool: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One round's training samples of a client: its positives shuffled, each followed by
    ``n_negatives`` distinct items it never interacted with (uniform over the catalogue, or
    over the round's public ``pool`` of items when given: :func:`negative_pool`).

    Returns (items (P*(1+n),) int64, labels (P*(1+n),) float32).
    """
    pos = rng.permutation(np.asarray(positives, dtype=np.int64))
    p = len(pos)
    seen = np.sort(pos)  # repeats do not matter to the membership test below
    check_drawable(seen, n_items, n_negatives, pool)
    negs = draw_items(rng, n_items, pool, (p, n_negatives))
    while True:
        # bad: a negative the client has seen, or equal to an earlier negative of its row
        # (membership by binary search in the sorted ``seen``: np.isin costs about 100 us a
        # call on arrays this small, half of drawing a FilmTrust client's samples)
        if p:
            at = np.minimum(np.searchsorted(seen, negs), p - 1)
            bad = seen[at] == negs
        else:
            bad = np.zeros(negs.shape, dtype=bool)
        bad |= repeated_in_row(negs)
        n_bad = int(np.count_nonzero(bad))
        if n_bad == 0:
            break
        negs[bad] = draw_items(rng, n_items, pool, n_bad)
    items = np.concatenate([pos[:, None], negs], axis=1).reshape(-1)
    labels = np.zeros((p, 1 + n_negatives), dtype=np.float32)
    labels[:, 0] = 1.0
    return items, labels.reshape(-1)


def chunk_weights(n: int, chunk_size: int) -> np.ndarray:
    """Per-sample loss weights so that sum(w * bce) = sum over chunks of the chunk's mean BCE."""
    w = np.full(n, 1.0 / chunk_size, dtype=np.float32)
    tail = n % chunk_size
    if tail:
        w[n - tail :] = 1.0 / tail
    return w


@dataclass
class StepResult:
    """What a cohort's client step produces: uploads (in input order) and the new private state."""

    uploads: list[Update]
    state: PrivateState
    losses: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: ``sum_c weights_c upload_c`` (dense) when :func:`cohort_step` was given weights
    aggregate: dict[str, Tensor] | None = None
    #: the worker's partial sum (``upload_grouping=worker``), instead of ``uploads``
    partial: PartialSum | None = None
    #: adaptive DP clipping: whether each upload's norm was within the round's clip norm
    within: np.ndarray | None = None


def _norm_factor(rho: float, sq: Tensor) -> Tensor:
    """rho / (||g|| + 1e-12) per client, from the squared norms (C,)."""
    return rho / (sq.sqrt() + 1e-12)


def _bcast(f: Tensor, t: Tensor) -> Tensor:
    """A per-client factor (C,) shaped to multiply a (C, ...) tensor."""
    return f.reshape(-1, *([1] * (t.dim() - 1)))


def _reduce(
    lay: Layout, g: SharedGrads, weights: Tensor, tables: dict[str, Tensor]
) -> dict[str, Tensor]:
    """``sum_c weights_c g_c`` of per-client shared gradients, the item rows added to
    ``tables`` (I, d), the dense ones with the parameters' shapes."""
    out: dict[str, Tensor] = {}
    w_pair = weights[lay.pair_client][:, None]
    for t, r in g.rows.items():
        out[t] = tables[t].index_add_(0, lay.pair_items, r * w_pair)
    for n, d in g.dense.items():
        out[n] = torch.tensordot(weights, d, dims=1)
    return out


def _group_step(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    priv: dict[str, Tensor],
    samples: list[tuple[np.ndarray, np.ndarray]],
    hp: SAMConfig,
    weights: Tensor | None,
    tables: dict[str, Tensor],
) -> tuple[Layout, SharedGrads | dict[str, Tensor], dict[str, Tensor], Tensor]:
    """The three passes for one group of clients (:mod:`fedrecgel.passes`).

    Returns the layout, the shared upload gradients (per client, or ``sum_c weights_c g_c``
    when ``weights`` is given: item rows added to ``tables``, the dense part new), the private
    SAM gradient name -> (C, d) and the pass-1 loss (C,).
    """
    lay = make_layout(samples, cfg.n_items, hp.chunk_size)
    upload, g_priv, loss = layout_step(cfg, lay, shared, priv, hp, weights, tables)
    return lay, upload, g_priv, loss


def layout_step(
    cfg: ModelConfig,
    lay: Layout,
    shared: dict[str, Tensor],
    priv: dict[str, Tensor],
    hp: SAMConfig,
    weights: Tensor | None,
    tables: dict[str, Tensor],
) -> tuple[SharedGrads | dict[str, Tensor], dict[str, Tensor], Tensor]:
    """:func:`_group_step`'s three passes on a ready layout: tensor work only (what
    bench/compile_dynamic.py hands to ``torch.compile``); the same returns, less the layout."""
    dense_names = cfg.dense_names()
    dense = {n: shared[n] for n in dense_names}
    ig = shared["item_gmf"].index_select(0, lay.items)
    im = shared["item_mlp"].index_select(0, lay.items) if cfg.kind == "ncf" else None

    # pass 1: gradients at the unperturbed point
    fw1 = passes.forward(cfg, lay, priv, ig, im, dense, False)
    loss, d1 = passes.loss_grad(lay, fw1.logits)
    g_sh, g_ns = passes.backward(cfg, lay, fw1, priv, dense, False, d1, "per_client", True)
    assert g_sh is not None

    # pass 2: the shared SAM gradient (the upload), at each client's own perturbed point
    upload: SharedGrads | dict[str, Tensor] = g_sh
    if hp.rho_sh > 0:
        sq = torch.zeros(lay.n_clients)
        for r in g_sh.rows.values():
            sq.index_add_(0, lay.pair_client, torch.linalg.vector_norm(r, dim=1).square_())
        for d in g_sh.dense.values():
            sq += torch.linalg.vector_norm(d.reshape(lay.n_clients, -1), dim=1).square_()
        factor = _norm_factor(hp.rho_sh, sq)
        f_pair = factor.index_select(0, lay.pair_client)[:, None]
        # shared + e_sh, written over the gradients (no longer needed)
        rows2 = {
            t: torch.addcmul(shared[t].index_select(0, lay.pair_items), r, f_pair, out=r)
            for t, r in g_sh.rows.items()
        }
        ig2 = rows2["item_gmf"].index_select(0, lay.sample_pair)
        im2 = rows2["item_mlp"].index_select(0, lay.sample_pair) if cfg.kind == "ncf" else None
        dense2 = {
            n: torch.addcmul(shared[n], g, _bcast(factor, g), out=g) for n, g in g_sh.dense.items()
        }
        del g_sh, rows2
        fw2 = passes.forward(cfg, lay, priv, ig2, im2, dense2, True)
        _, d2 = passes.loss_grad(lay, fw2.logits, weights)
        mode = "per_client" if weights is None else "aggregate"
        g2, _ = passes.backward(cfg, lay, fw2, priv, dense2, True, d2, mode, False, tables)
        assert g2 is not None
        del fw2, dense2
        upload = g2 if weights is None else {**g2.rows, **g2.dense}
    elif weights is not None:
        upload = _reduce(lay, g_sh, weights, tables)

    # pass 3: the private SAM gradient, shared part unperturbed and common to all clients
    g_priv = g_ns
    if hp.rho_ns > 0:
        sq = torch.zeros(lay.n_clients)
        for g in g_ns.values():
            sq += torch.linalg.vector_norm(g, dim=1).square_()
        factor = _norm_factor(hp.rho_ns, sq)
        priv3 = {k: torch.addcmul(v, g_ns[k], factor[:, None]) for k, v in priv.items()}
        fw3 = passes.forward(cfg, lay, priv3, ig, im, dense, False, fw1.item_first)
        _, d3 = passes.loss_grad(lay, fw3.logits)
        _, g_priv = passes.backward(cfg, lay, fw3, priv3, dense, False, d3, None, True)
    return upload, g_priv, loss


def native_fits(cfg: ModelConfig, hp: SAMConfig) -> bool:
    """Whether :mod:`fedrecgel.native` computes this model's aggregate path (NCF, rho_sh > 0)."""
    return cfg.kind == "ncf" and hp.rho_sh > 0


def cohort_step(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    user_ids: np.ndarray,
    state: PrivateState,
    samples: list[tuple[np.ndarray, np.ndarray]],
    hp: SAMConfig,
    weights: np.ndarray | None = None,
) -> StepResult:
    """Run the hierarchical SAM client step for C clients together.

    shared:   the round's global parameters (not modified)
    user_ids: (C,) the clients; ``state`` holds their private state in the same order
    samples:  per client (items, labels) from :func:`client_samples`
    weights:  when given (C,), no uploads are built: the result's ``aggregate`` is
              ``sum_c weights_c upload_c``, summed inside the backward (dense, the parameters'
              shapes); what a weighted-mean server strategy needs, in less time and memory
    Returns the uploads (in input order), the new private state (a copy) and losses (C,).
    With ``weights``, clients go in groups of consecutive clients of at most
    ``hp.max_batch_samples`` samples (one client may exceed it); per-client uploads are
    computed one client at a time, so each is the same whatever else is computed with it
    (in groups too with ``hp.grouped_uploads``: faster, the rounding depends on the group).
    """
    keep_freed_memory()  # a step frees what the next one allocates again: keep it mapped
    c = len(user_ids)
    new_state = state.select(slice(None))
    uploads: list[Update] = []
    losses = np.zeros(c, dtype=np.float64)
    sizes = np.fromiter((len(s[0]) for s in samples), dtype=np.int64, count=c)
    priv_grads = {k: torch.empty_like(v) for k, v in state.params.items()}
    shared_d = {k: v.detach() for k, v in shared.items()}
    total: dict[str, Tensor] | None = None
    tables: dict[str, Tensor] = {}
    if weights is not None:
        shapes = cfg.shared_shapes()
        tables = {t: torch.zeros(shapes[t]) for t in cfg.item_tables()}
    w_all = None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    ops = native.kernels() if native_fits(cfg, hp) else None
    # per-client uploads: one client at a time, so that a client's float rounding never
    # depends on which other clients are computed with it (a worker recomputes only the
    # clients still pending after a crash, and must get the same bytes)
    groups = groups_of(sizes, weights is not None or hp.grouped_uploads, hp.max_batch_samples)
    with torch.no_grad():
        # the SAM step starts from the fitted embeddings and their Adam state (no local
        # steps: the state as given); new_state is written again only after the last group
        fit_private_(cfg, shared_d, new_state, samples, groups, hp)
        state = new_state
        for start, stop in groups:
            priv = {k: v[start:stop] for k, v in state.params.items()}
            w = None if w_all is None else w_all[start:stop]
            group = samples[start:stop]
            up: SharedGrads | dict[str, Tensor]
            if w is not None and ops is not None:
                rho = (hp.rho_sh, hp.rho_ns)
                lay, up, g_priv, loss = native.group_step(
                    ops, cfg, shared_d, priv, group, rho, hp.chunk_size, w, tables
                )
            else:
                lay, up, g_priv, loss = _group_step(cfg, shared_d, priv, group, hp, w, tables)
            if isinstance(up, dict):
                if total is None:
                    total = up
                else:
                    for k, v in up.items():
                        if k not in tables:  # the item tables were summed in place
                            total[k].add_(v)
            else:
                uploads += _uploads(cfg, lay, up, user_ids[start:stop], sizes[start:stop], loss)
            losses[start:stop] = loss.numpy()
            for k, g in g_priv.items():
                priv_grads[k][start:stop] = g
        adam_(new_state, priv_grads, hp.client_lr, hp.betas, hp.eps, hp.weight_decay)
    return StepResult(uploads=uploads, state=new_state, losses=losses, aggregate=total)


def _uploads(
    cfg: ModelConfig,
    lay: Layout,
    g: SharedGrads,
    user_ids: np.ndarray,
    sizes: np.ndarray,
    loss: Tensor,
) -> list[Update]:
    """Each client's upload: views of the group's gradients (no copies)."""
    out = []
    po = lay.pair_offsets.tolist()
    for i, uid in enumerate(user_ids.tolist()):
        a, b = po[i], po[i + 1]
        idx = lay.pair_items[a:b]
        out.append(
            Update(
                client_id=int(uid),
                n_samples=int(sizes[i]),
                rows={t: (idx, r[a:b]) for t, r in g.rows.items()},
                dense={n: d[i] for n, d in g.dense.items()},
                loss=float(loss[i]),
            )
        )
    return out
