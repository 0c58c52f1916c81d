"""Row-wise tests on integer arrays shared by the data protocol and the client samples."""

from __future__ import annotations

import numpy as np


def repeated_in_row(values: np.ndarray) -> np.ndarray:
    """bool of ``values``' (rows, k) shape: the entry also appears earlier in its row. Sorts
    each row (stable, so equal values keep their column order): O(k log k) a row."""
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    later = np.zeros(values.shape, dtype=bool)
    later[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    out = np.empty(values.shape, dtype=bool)
    np.put_along_axis(out, order, later, axis=1)
    return out
