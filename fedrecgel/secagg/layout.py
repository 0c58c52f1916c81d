"""A model update as one fixed-length vector, the layout secure aggregation masks.

Masked vectors of a cohort are only summable when every client lays its update out the same
way, whatever items it touched: so the item tables travel dense (every row, zeros where the
client had no sample), followed by the score network, in the canonical order of
:meth:`~fedrecgel.model.ModelConfig.shared_shapes`, and one last slot for the client's
training loss (so the server learns the cohort's summed loss, not each client's).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update


def vector_length(cfg: ModelConfig) -> int:
    """Values in one secure-aggregation input: every shared parameter, plus the loss slot."""
    return sum(int(np.prod(s)) for s in cfg.shared_shapes().values()) + 1


def flatten(cfg: ModelConfig, u: Update) -> np.ndarray:
    """``u`` densified into the fixed layout (float64, :func:`vector_length` values)."""
    out = np.zeros(vector_length(cfg), dtype=np.float64)
    start = 0
    for name, shape in cfg.shared_shapes().items():
        size = int(np.prod(shape))
        view = out[start : start + size].reshape(shape)
        if name in u.rows:
            idx, vals = u.rows[name]
            view[idx.numpy()] = vals.double().numpy()
        else:
            view[...] = u.dense[name].double().numpy()
        start += size
    out[start] = u.loss
    return out


def unflatten(cfg: ModelConfig, vec: np.ndarray) -> tuple[dict[str, Tensor], float]:
    """Inverse of :func:`flatten` (float32 tensors by parameter name, and the loss slot)."""
    if vec.shape != (vector_length(cfg),):
        raise ValueError(f"vector of {vec.shape} does not fit the model's layout")
    out: dict[str, Tensor] = {}
    start = 0
    for name, shape in cfg.shared_shapes().items():
        size = int(np.prod(shape))
        out[name] = torch.from_numpy(vec[start : start + size].reshape(shape).astype(np.float32))
        start += size
    return out, float(vec[start])
