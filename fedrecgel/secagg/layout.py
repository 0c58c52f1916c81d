"""A model update as one fixed-length vector, the layout secure aggregation masks.

Masked vectors of a cohort are only summable when every client lays its update out the same
way, whatever items it touched: so the item tables travel dense (every row, zeros where the
client had no sample), followed by the score network, in the canonical order of
:meth:`~fedrecgel.model.ModelConfig.shared_shapes`, and one last slot for the client's
training loss (so the server learns the cohort's summed loss, not each client's).

Sparse secure aggregation lays out only a public, sorted set of item ``rows`` of each table
(the round's union, :func:`fedrecgel.secagg.aggregate.secure_sparse_mean`), the same for every
client; an update that touches a row outside them is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update


def _shapes(cfg: ModelConfig, rows: np.ndarray | None) -> dict[str, tuple[int, ...]]:
    """The laid-out shape of each shared parameter (item tables cut to ``rows``)."""
    shapes = cfg.shared_shapes()
    if rows is None:
        return shapes
    tables = cfg.item_tables()
    return {n: ((len(rows), *s[1:]) if n in tables else s) for n, s in shapes.items()}


def vector_length(cfg: ModelConfig, rows: np.ndarray | None = None) -> int:
    """Values in one secure-aggregation input: every shared parameter (the item tables' ``rows``
    only, when given), plus the loss slot."""
    return sum(int(np.prod(s)) for s in _shapes(cfg, rows).values()) + 1


def row_values(cfg: ModelConfig, rows: np.ndarray | None = None) -> int:
    """How many of the first values of the layout are item-table rows (the tables come first)."""
    tables = cfg.item_tables()
    return sum(int(np.prod(s)) for n, s in _shapes(cfg, rows).items() if n in tables)


def positions(rows: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Where ``items`` sit in the sorted ``rows`` (ValueError when one is not there)."""
    at = np.searchsorted(rows, items)
    if len(items) and (at.max() >= len(rows) or not np.array_equal(rows[at], items)):
        raise ValueError("the update touches item rows outside the round's laid-out rows")
    return at


def flatten(
    cfg: ModelConfig,
    u: Update,
    rows: np.ndarray | None = None,
    dtype: type[np.floating[Any]] = np.float64,
) -> np.ndarray:
    """``u`` densified into the fixed layout (:func:`vector_length` values of ``dtype``:
    float32 holds a float32 update exactly, all but its loss slot)."""
    out = np.zeros(vector_length(cfg, rows), dtype=dtype)
    start = 0
    for name, shape in _shapes(cfg, rows).items():
        size = int(np.prod(shape))
        view = out[start : start + size].reshape(shape)
        if name in u.rows:
            idx, vals = u.rows[name]
            at = idx.numpy() if rows is None else positions(rows, idx.numpy())
            view[at] = vals.numpy()  # cast on assignment, no copy of its own
        elif rows is not None and name in cfg.item_tables():
            raise ValueError(f"a dense {name} cannot be laid out on a subset of its rows")
        else:
            view[...] = u.dense[name].numpy()
        start += size
    out[start] = u.loss
    return out


def unflatten(
    cfg: ModelConfig, vec: np.ndarray, rows: np.ndarray | None = None
) -> tuple[dict[str, Tensor], float]:
    """Inverse of :func:`flatten` (float32 tensors by parameter name, at their full shapes:
    rows outside ``rows`` are zero; and the loss slot)."""
    if vec.shape != (vector_length(cfg, rows),):
        raise ValueError(f"vector of {vec.shape} does not fit the model's layout")
    full = cfg.shared_shapes()
    out: dict[str, Tensor] = {}
    start = 0
    for name, shape in _shapes(cfg, rows).items():
        size = int(np.prod(shape))
        block = vec[start : start + size].reshape(shape).astype(np.float32)
        if shape != full[name]:
            whole = np.zeros(full[name], dtype=np.float32)
            whole[rows] = block
            block = whole
        out[name] = torch.from_numpy(block)
        start += size
    return out, float(vec[start])
