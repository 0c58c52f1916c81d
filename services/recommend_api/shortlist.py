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

Index: faiss ``IndexFlatIP`` (an exact inner-product scan of the proxy vectors) up to
``ivf_above`` items, above that an IVF index with 8-bit scalar-quantised vectors scanned over
``nprobe`` of its ``nlist`` lists (a quarter of the catalogue at 1,000,000 items), and at
least ``ivf_candidates`` candidates are re-ranked. On an item side without low-rank structure
(a briefly trained 1e6-item model whose untouched items keep their random initial vectors:
the proxy keeps about 200 of 256 directions) the lists separate the top items poorly, so
recall depends on both (bench/recommend_load.py reports it). Everything is built in item chunks, so a build never holds a second full-size
copy of the catalogue. faiss is optional: without it :func:`build_shortlist` returns None
and ranking stays exact.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import Scorer

log = logging.getLogger(__name__)

faiss: Any
try:  # optional dependency
    import faiss as _faiss

    faiss = _faiss
    faiss.omp_set_num_threads(1)  # concurrency comes from the request thread pool
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

_CHUNK = 65_536  # items per step when building the index


def faiss_available() -> bool:
    """Whether the optional ANN library (faiss) can be used."""
    return faiss is not None


@dataclass(frozen=True)
class ShortlistConfig:
    """Shape of the candidate index (see the module docstring)."""

    fit_samples: int = 512
    variance: float = 0.95
    pca_samples: int = 20_000
    ivf_above: int = 200_000
    nprobe: int = 256
    # candidates re-ranked at least when the index is IVF (a large catalogue): its lists
    # hold the true top items less reliably than an exact scan (bench/results/recommend_load.json)
    ivf_candidates: int = 3_000
    seed: int = 0


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

    def __init__(self, scorer: Scorer, config: ShortlistConfig | None = None) -> None:
        if faiss is None:
            raise RuntimeError("faiss is not installed")
        self.config = c = config or ShortlistConfig()
        cfg, s = scorer.cfg, scorer.shared
        self.scorer = scorer
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
        self.dim = cfg.factor + (self.basis.shape[1] if cfg.kind == "ncf" else 0)
        self.index = self._build_index(n, gen)
        # the fewest candidates a search returns (more for IVF, see ShortlistConfig)
        self.min_candidates = c.ivf_candidates if n > c.ivf_above else 0

    def project(self, b: Tensor) -> Tensor:
        """Reduced tower features ``z(b)`` of first-layer item halves: (N, H) -> (N, rank)."""
        return (_features(b) - self.mean) @ self.basis

    def vectors(self, rows: Tensor | slice) -> np.ndarray:
        """Index vectors of the items ``rows`` (float32, C-contiguous)."""
        gmf = self.scorer.shared["item_gmf"][rows]
        if self.gmf_scale is None:
            v = gmf
        else:
            assert self.scorer.item_first is not None
            v = torch.cat([gmf * self.gmf_scale, self.project(self.scorer.item_first[rows])], 1)
        return np.ascontiguousarray(v.numpy(), dtype=np.float32)

    def _build_index(self, n: int, gen: torch.Generator) -> Any:
        c = self.config
        if n <= c.ivf_above:
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
    def query(self, private: dict[str, Tensor]) -> np.ndarray:
        """The proxy query vector of one user (rows of ``private`` are (1, d))."""
        ug = private["user_gmf"][0]
        parts = [ug]
        if self.gmf_scale is not None:
            s = self.scorer.shared
            a = private["user_mlp"][0] @ self.scorer.user_w0.T + s["tower.0.bias"]
            y = tower_tail(self.scorer, a + self.fit_first)
            parts.append(self.fit_proj @ (y - y.mean()))
        return np.ascontiguousarray(torch.cat(parts).numpy()[None, :], dtype=np.float32)

    def search(self, private: dict[str, Tensor], n: int) -> Tensor:
        """Indices of the ``n`` items with the highest proxy score (int64, unordered)."""
        _, idx = self.index.search(self.query(private), n)
        found = idx[0]
        return torch.from_numpy(found[found >= 0].astype(np.int64))


def build_shortlist(scorer: Scorer, config: ShortlistConfig | None = None) -> ProxyShortlist | None:
    """A shortlist index for ``scorer``'s catalogue, or None (with a warning) without faiss."""
    if faiss is None:
        log.warning(
            "faiss is not installed: ranking %d items exactly (slow for large catalogues); "
            "pip install faiss-cpu to enable the shortlist index",
            scorer.cfg.n_items,
        )
        return None
    return ProxyShortlist(scorer, config)
