"""The gradient-sign attack: what a curious server learns of a client's items from its upload.

With the BCE loss, the logit s of a (user, item) sample has dL/ds = sigmoid(s) - y: negative
for a positive (y = 1), positive for a negative (y = 0). An item's row of the GMF table enters
the logit only through ``user_gmf * item_gmf . predict.weight[:F]`` (:func:`fedrecgel.model.
forward_batched`), so the row gradient of every item a client trained on is the same vector
d = user_gmf * predict.weight[:F] (one per client, at the SAM-perturbed point) times the sum of
that item's dL/ds. All rows of one upload are therefore parallel to d, positives on one side
and sampled negatives on the other. The server does not know d (user_gmf is private), but it
can take the rows' principal direction and split the rows by the sign of their projection;
since a client samples ``n_negatives`` negatives per positive, the smaller side is its
positives. Rows with a zero gradient (untouched items) are never named.
"""

from __future__ import annotations

import numpy as np


def sign_attack(rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The items the rule names as positives, from one upload's ``item_gmf`` rows
    (``rows`` (U,) item ids, ``values`` (U, F) their gradients)."""
    v = np.asarray(values, dtype=np.float64)
    keep = np.abs(v).sum(axis=1) > 0
    rows, v = np.asarray(rows)[keep], v[keep]
    if len(rows) == 0:
        return rows
    _, _, vt = np.linalg.svd(v, full_matrices=False)
    side = v @ vt[0] > 0
    pick = side if side.sum() <= (~side).sum() else ~side
    return np.sort(rows[pick])


def precision(named: np.ndarray, positives: np.ndarray) -> float:
    """The share of named items that are truly the client's positives (0 when none named)."""
    if len(named) == 0:
        return 0.0
    return float(np.isin(named, positives).mean())
