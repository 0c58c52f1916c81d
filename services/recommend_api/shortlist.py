"""The candidate stage of two-stage ranking: an inner-product index over an NCF proxy.

NCF is not an inner product: its score is

    s(u, i) = <w_g, u_g * i_g> + <w_m, T(a_u + b_i)> + c

with ``a_u = W0_user u_mlp + bias0`` and ``b_i = W0_item i_mlp`` (the item half of the first
tower layer, which :class:`fedrecgel.model.Scorer` precomputes) and ``T`` the rest of the
ReLU tower. The GMF half is already an inner product: ``<u_g, w_g * i_g>``. For the tower we
fit, per request, a linear model in item features:

    <w_m, T(a_u + b)>  ~  <v_u, z(b)> + const(u),     z(b) = P^T (phi(b) - mean),  phi(b) = [b, |b|]

by ridge regression over a fixed random sample of catalogue items scored exactly.
``[b, |b|]`` spans ``relu(b)`` and ``relu(-b)``, so the fit captures the first ReLU exactly
for units whose user pre-activation is near zero and linearly for units that are firmly on
or off. ``P`` holds the leading principal directions of ``phi`` over the catalogue that
explain ``variance`` of it (the item side's own learned projection): a trained model's item
side is low-rank (Amazon-Video: 8 of 256 directions explain 90%, about 30 explain 95%), so
the fit and the index work in a few dozen dimensions instead of ``2H``, several times
cheaper, with no recall lost there (bench/recommend_load.py reports it); an untrained model
with random item tables keeps most directions. The
sample's design matrix is fixed per model version, so a request costs one tower pass over
the sample plus a (rank x sample) matrix-vector product. The index holds ``[w_g * i_g, z(b_i)]``,
the query is ``[u_g, v_u]``, and the candidates are re-ranked with the exact model
(:func:`services.recommend_api.ranking.top_k`).

Index (``ShortlistConfig.index``): faiss ``IndexFlatIP`` (an exact inner-product scan of the
proxy vectors, ``flat``) or an IVF index with 8-bit scalar-quantised vectors scanned over
``nprobe`` of its ``nlist`` lists (``ivf``; at least ``ivf_candidates`` are re-ranked). Both
are built in item chunks, so a build never holds a second full-size copy of the catalogue.

Large catalogues (``auto`` above ``flat_up_to`` items) use no index at all: :class:`ScanShortlist`
scans the model's own item tables per request with a sharper proxy, linear in the exact first
tower layer of that user,

    <w_m, T(a_u + b)>  ~  <v_u, relu(a_u + b)> + const(u),

fitted per request by ridge regression over a fixed sample of items (the first ReLU is exact
for every unit; only the deeper layers are linearised), plus the GMF half exactly:
``<u_g * w_g, i_g>``. A request reads the (I, H) first-layer table and the (I, F) GMF table
once (about 0.6 GB at 1,000,000 items, memory-bound) and re-ranks ``scan_candidates``; it
needs no memory beyond the tables the exact re-rank holds anyway. On a briefly trained
1e6-item model whose untouched items keep their random initial vectors (no low-rank
structure: the ``[b, |b|]`` proxy keeps about 200 of 256 directions) IVF lists separate the
top items poorly and the ``[b, |b|]`` proxy loses more; the scan recalls more in less time
(bench/shortlist_recall.py). faiss is optional: without it :func:`build_shortlist` still builds
the scan above ``flat_up_to`` items, and below that returns None (ranking stays exact).

Popularity prior (:mod:`services.recommend_api.prior`): the served score adds ``w * p_i``,
``p_i = log(1 + n_i)``, so the recall stage must add it too, or a popular item the prior ranks
first could miss the candidates. The term is an exact inner product: the faiss index holds
``p_i`` as one more column of every item vector and the query carries ``w`` as one more
coordinate (``q . v + w * p_i``). The column depends on the counts only, not on the weight: it
is added when the counts become usable (once per run, :meth:`ProxyShortlist.with_log_prior`
re-adds the vectors to a new index, reusing the fitted projection), while a new weight only
changes the query (at weight 0 a flat index scores as without the column; an IVF index's lists
were trained with it). The scan adds the snapshot's precomputed bias ``w * p`` to its proxy
scores chunk by chunk, so it never rebuilds anything. Either way the candidates are re-ranked
by the exact served score (:func:`services.recommend_api.ranking.top_k`).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import Scorer
from services.recommend_api.prior import ServedPrior

log = logging.getLogger(__name__)

faiss: Any
try:  # optional dependency
    import faiss as _faiss

    faiss = _faiss
    faiss.omp_set_num_threads(1)  # concurrency comes from the request thread pool
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

_CHUNK = 65_536  # items per step when building the index
_SCAN_CHUNK = 2_048  # items per step of a scan: its (chunk, H) activations stay in cache


def faiss_available() -> bool:
    """Whether the optional ANN library (faiss) can be used."""
    return faiss is not None


@dataclass(frozen=True)
class ShortlistConfig:
    """Shape of the candidate index (see the module docstring)."""

    fit_samples: int = 512
    variance: float = 0.95
    pca_samples: int = 20_000
    # "auto": a faiss flat index up to ``flat_up_to`` items, the per-request scan above
    index: Literal["auto", "flat", "ivf", "scan"] = "auto"
    flat_up_to: int = 200_000
    nprobe: int = 256
    # candidates re-ranked at least when the index is IVF (a large catalogue): its lists
    # hold the true top items less reliably than an exact scan (bench/results/recommend_load.json)
    ivf_candidates: int = 3_000
    # candidates re-ranked at least by the scan (bench/shortlist_recall.py: recall@10 0.99 at
    # 10,000 of 1,000,000 items on the trained synthetic model)
    scan_candidates: int = 10_000
    seed: int = 0

    def kind_for(self, n_items: int) -> str:
        """The candidate stage for a catalogue of ``n_items``: flat, ivf or scan."""
        if self.index != "auto":
            return self.index
        return "flat" if n_items <= self.flat_up_to else "scan"


class Shortlist(Protocol):
    """A candidate stage: the items worth scoring exactly for one user."""

    kind: str
    n_items: int
    min_candidates: int
    #: the log-prior whose term the recall includes (None: the model's proxy alone)
    log_prior: Tensor | None

    def search(
        self, private: dict[str, Tensor], n: int, prior: ServedPrior | None = None
    ) -> Tensor:
        """Indices of ``n`` candidate items (int64, unordered); with ``prior`` (whose
        ``log_prior`` must be this stage's) recalled by proxy score + ``prior.bias``."""
        ...

    def with_log_prior(self, log_prior: Tensor | None) -> Shortlist:
        """This stage for the same model with ``log_prior`` as its prior term (itself when it
        already has that tensor)."""
        ...


def _check_prior(stage: Shortlist, prior: ServedPrior | None) -> None:
    """A served prior must be the one the stage was built for (a snapshot keeps them so)."""
    if prior is not None and prior.log_prior is not stage.log_prior:
        raise ValueError("the served prior is not the one the candidate stage holds")


def tower_tail(scorer: Scorer, pre: Tensor) -> Tensor:
    """``<w_m, T(pre)>`` for first-layer pre-activations ``pre`` (N, H) -> (N,)."""
    s, cfg = scorer.shared, scorer.cfg
    h = torch.relu(pre)
    for k in range(1, cfg.layers):
        h = torch.relu(torch.nn.functional.linear(h, s[f"tower.{k}.weight"], s[f"tower.{k}.bias"]))
    return h @ s["predict.weight"][0, cfg.factor :]


def _features(b: Tensor) -> Tensor:
    """Item features of the tower proxy: (N, H) -> (N, 2H)."""
    return torch.cat([b, b.abs()], dim=1)


class ProxyShortlist:
    """Inner-product index over proxy item vectors; see the module docstring."""

    def __init__(
        self,
        scorer: Scorer,
        config: ShortlistConfig | None = None,
        log_prior: Tensor | None = None,
    ) -> None:
        if faiss is None:
            raise RuntimeError("faiss is not installed")
        self.config = c = config or ShortlistConfig()
        cfg, s = scorer.cfg, scorer.shared
        self.scorer = scorer
        self.log_prior = _checked_prior(log_prior, cfg.n_items)
        n = cfg.n_items
        gen = torch.Generator().manual_seed(c.seed)
        if cfg.kind == "ncf":
            b = scorer.item_first
            assert b is not None
            self.gmf_scale: Tensor | None = s["predict.weight"][0, : cfg.factor]
            pca_rows = torch.randperm(n, generator=gen)[: min(c.pca_samples, n)]
            x = _features(b[pca_rows])
            self.mean = x.mean(0)
            x = x - self.mean
            _, sv, vt = torch.linalg.svd(x, full_matrices=False)
            explained = (sv * sv).cumsum(0) / max(float((sv * sv).sum()), 1e-30)
            rank = min(int((explained < c.variance).sum()) + 1, len(sv))
            self.basis = vt[:rank].T.contiguous()  # (2H, rank)
            # a ridge fit wants several samples per weight
            n_fit = min(max(c.fit_samples, 8 * rank), n)
            self.fit_idx = torch.randperm(n, generator=gen)[:n_fit]
            z = self.project(b[self.fit_idx])
            z = z - z.mean(0)
            ridge = 1e-3 * float((z * z).sum()) / max(len(z), 1) + 1e-12
            # (rank, S): maps the sample's centred exact tower outputs to the fit's weights
            self.fit_proj = torch.linalg.solve(z.T @ z + ridge * torch.eye(rank), z.T).contiguous()
            self.fit_first = b[self.fit_idx].contiguous()
        else:  # MF: the score is exactly <u_g, i_g>
            self.gmf_scale = None
        # the model's proxy dimensions; the index has one more with a prior column
        self.model_dim = cfg.factor + (self.basis.shape[1] if cfg.kind == "ncf" else 0)
        self.kind = "ivf" if c.kind_for(n) == "ivf" else "flat"
        self.n_items = n
        self._gen_state = gen.get_state()  # a rebuild trains an IVF index on the same rows
        self.index = self._build_index(n, gen)
        # the fewest candidates a search returns (more for IVF, see ShortlistConfig)
        self.min_candidates = c.ivf_candidates if self.kind == "ivf" else 0

    def project(self, b: Tensor) -> Tensor:
        """Reduced tower features ``z(b)`` of first-layer item halves: (N, H) -> (N, rank)."""
        z: Tensor = (_features(b) - self.mean) @ self.basis
        return z

    @property
    def dim(self) -> int:
        """Dimension of the index vectors (the model's proxy, plus the prior column if any)."""
        return self.model_dim + (self.log_prior is not None)

    def with_log_prior(self, log_prior: Tensor | None) -> ProxyShortlist:
        """This index with ``log_prior`` as its last column: the fitted projection is shared,
        the vectors are added to a new index (the old one keeps serving meanwhile)."""
        if log_prior is self.log_prior:
            return self
        other = copy.copy(self)
        other.log_prior = _checked_prior(log_prior, self.n_items)
        other.index = other._build_index(self.n_items, torch.Generator().set_state(self._gen_state))
        return other

    def vectors(self, rows: Tensor | slice) -> np.ndarray:
        """Index vectors of the items ``rows`` (float32, C-contiguous)."""
        gmf = self.scorer.shared["item_gmf"][rows]
        if self.gmf_scale is None:
            v = gmf
        else:
            assert self.scorer.item_first is not None
            v = torch.cat([gmf * self.gmf_scale, self.project(self.scorer.item_first[rows])], 1)
        if self.log_prior is not None:
            v = torch.cat([v, self.log_prior[rows][:, None]], 1)
        return np.ascontiguousarray(v.numpy(), dtype=np.float32)

    def _build_index(self, n: int, gen: torch.Generator) -> Any:
        c = self.config
        if self.kind == "flat":
            index: Any = faiss.IndexFlatIP(self.dim)
        else:
            nlist = max(16, min(4096, int(math.sqrt(n))))
            index = faiss.index_factory(self.dim, f"IVF{nlist},SQ8", faiss.METRIC_INNER_PRODUCT)
            rows = torch.randperm(n, generator=gen)[: 40 * nlist].sort().values
            index.train(self.vectors(rows))
            index.nprobe = min(c.nprobe, nlist)
        for start in range(0, n, _CHUNK):
            index.add(self.vectors(slice(start, min(start + _CHUNK, n))))
        return index

    @torch.no_grad()
    def query(self, private: dict[str, Tensor], weight: float = 0.0) -> np.ndarray:
        """The proxy query vector of one user (rows of ``private`` are (1, d)); with a prior
        column, ``weight`` is its coordinate."""
        ug = private["user_gmf"][0]
        parts = [ug]
        if self.gmf_scale is not None:
            s = self.scorer.shared
            a = private["user_mlp"][0] @ self.scorer.user_w0.T + s["tower.0.bias"]
            y = tower_tail(self.scorer, a + self.fit_first)
            parts.append(self.fit_proj @ (y - y.mean()))
        if self.log_prior is not None:
            parts.append(torch.tensor([weight], dtype=ug.dtype))
        return np.ascontiguousarray(torch.cat(parts).numpy()[None, :], dtype=np.float32)

    def search(
        self, private: dict[str, Tensor], n: int, prior: ServedPrior | None = None
    ) -> Tensor:
        """Indices of the ``n`` items with the highest proxy score (+ the prior's term, if
        any) (int64, unordered)."""
        _check_prior(self, prior)
        _, idx = self.index.search(self.query(private, 0.0 if prior is None else prior.weight), n)
        found = idx[0]
        return torch.from_numpy(found[found >= 0].astype(np.int64))


class ScanShortlist:
    """Candidates from a per-request scan of the model's own item tables (module docstring)."""

    kind = "scan"

    def __init__(
        self,
        scorer: Scorer,
        config: ShortlistConfig | None = None,
        log_prior: Tensor | None = None,
    ) -> None:
        self.config = c = config or ShortlistConfig()
        cfg = scorer.cfg
        self.scorer = scorer
        self.n_items = cfg.n_items
        # the scan reads the served bias per request: nothing depends on the prior but a check
        self.log_prior = _checked_prior(log_prior, cfg.n_items)
        self.min_candidates = c.scan_candidates
        self.gmf_scale: Tensor | None = None
        self.fit_first: Tensor | None = None
        if cfg.kind == "ncf":
            assert scorer.item_first is not None
            self.gmf_scale = scorer.shared["predict.weight"][0, : cfg.factor]
            gen = torch.Generator().manual_seed(c.seed)
            # a ridge fit wants several samples per weight (H weights)
            n_fit = min(max(c.fit_samples, 8 * scorer.item_first.shape[1]), cfg.n_items)
            rows = torch.randperm(cfg.n_items, generator=gen)[:n_fit]
            self.fit_first = scorer.item_first[rows.sort().values].contiguous()  # (S, H)

    @torch.no_grad()
    def fit(self, private: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The user's first-layer pre-activation ``a_u`` (H,) and tower weights ``v_u`` (H,)."""
        assert self.fit_first is not None
        s = self.scorer.shared
        a = private["user_mlp"][0] @ self.scorer.user_w0.T + s["tower.0.bias"]
        pre = a + self.fit_first
        y = tower_tail(self.scorer, pre)
        h = torch.relu(pre)
        h = h - h.mean(0)
        gram = h.T @ h
        ridge = 1e-3 * float(gram.diagonal().sum()) / max(len(h), 1) + 1e-12
        gram.diagonal().add_(ridge)
        v = torch.linalg.solve(gram, h.T @ (y - y.mean()))
        return a, v

    def with_log_prior(self, log_prior: Tensor | None) -> ScanShortlist:
        """This scan for a prior with ``log_prior`` (a shallow copy: nothing is rebuilt)."""
        if log_prior is self.log_prior:
            return self
        other = copy.copy(self)
        other.log_prior = _checked_prior(log_prior, self.n_items)
        return other

    @torch.no_grad()
    def scores(self, private: dict[str, Tensor], bias: Tensor | None = None) -> Tensor:
        """Proxy scores of every item (I,), up to a per-user constant, plus ``bias`` (I,)."""
        s = self.scorer.shared
        gmf = s["item_gmf"]
        ug = private["user_gmf"][0]
        if self.gmf_scale is None:  # MF: the proxy is the exact score
            exact = gmf @ ug
            return exact if bias is None else exact.add_(bias)
        first = self.scorer.item_first
        assert first is not None
        a, v = self.fit(private)
        qg = ug * self.gmf_scale
        out = torch.empty(self.n_items)
        buf = torch.empty(_SCAN_CHUNK, first.shape[1])
        for start in range(0, self.n_items, _SCAN_CHUNK):
            stop = min(start + _SCAN_CHUNK, self.n_items)
            h = torch.add(first[start:stop], a, out=buf[: stop - start]).relu_()
            o = out[start:stop]
            torch.mv(h, v, out=o)
            o.addmv_(gmf[start:stop], qg)
            if bias is not None:
                o.add_(bias[start:stop])
        return out

    def search(
        self, private: dict[str, Tensor], n: int, prior: ServedPrior | None = None
    ) -> Tensor:
        """Indices of the ``n`` items with the highest proxy score (+ the prior's bias, if
        any) (int64, unordered)."""
        _check_prior(self, prior)
        scores = self.scores(private, None if prior is None else prior.bias).numpy()
        if n >= self.n_items:
            return torch.arange(self.n_items)
        # a partition, not a sort: a third of torch.topk's time for 10,000 of 1,000,000
        return torch.from_numpy(np.argpartition(scores, -n)[-n:].astype(np.int64))


def _checked_prior(log_prior: Tensor | None, n_items: int) -> Tensor | None:
    """``log_prior`` if it has one float32 value per item; ValueError otherwise."""
    if log_prior is not None and (
        log_prior.shape != (n_items,) or log_prior.dtype != torch.float32
    ):
        raise ValueError(
            f"a prior of shape {tuple(log_prior.shape)} ({log_prior.dtype}) for {n_items} items"
        )
    return log_prior


def build_shortlist(
    scorer: Scorer, config: ShortlistConfig | None = None, log_prior: Tensor | None = None
) -> Shortlist | None:
    """The candidate stage for ``scorer``'s catalogue (:meth:`ShortlistConfig.kind_for`), with
    ``log_prior``'s term when given, or None (with a warning) when it needs faiss and faiss is
    not installed."""
    config = config or ShortlistConfig()
    if config.kind_for(scorer.cfg.n_items) == "scan":
        return ScanShortlist(scorer, config, log_prior)
    if faiss is None:
        log.warning(
            "faiss is not installed: ranking %d items exactly (slow for large catalogues); "
            "pip install faiss-cpu to enable the shortlist index",
            scorer.cfg.n_items,
        )
        return None
    return ProxyShortlist(scorer, config, log_prior)
