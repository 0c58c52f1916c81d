"""A cohort's training samples drawn together, each client from its own random stream.

:func:`cohort_samples` returns exactly what :func:`fedrecgel.sam.client_samples` returns for
each client: every client's generator sees the same calls in the same order (its permutation,
its first draw of negatives, then one redraw per round of rejections), so the draws are
identical. Only the checks between draws are batched: one binary search over the (client,
item) keys of all the cohort's positives, and one duplicate test over all rows of negatives,
instead of a dozen small numpy calls per client.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrecgel.sam import check_drawable, draw_items, repeated_in_row


def cohort_samples(
    positives: Sequence[np.ndarray],
    n_items: int,
    n_negatives: int,
    rngs: Sequence[np.random.Generator],
    pool: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per client (items, labels), as ``client_samples(positives[c], n_items, n_negatives,
    rngs[c], pool)`` gives them."""
    c = len(positives)
    pos = [
        rng.permutation(np.asarray(p, dtype=np.int64))
        for p, rng in zip(positives, rngs, strict=True)
    ]
    sizes = np.fromiter((len(p) for p in pos), dtype=np.int64, count=c)
    for p in pos:
        check_drawable(p, n_items, n_negatives, pool)
    if c == 0:
        return []
    negs = np.concatenate(
        [
            draw_items(rng, n_items, pool, (len(p), n_negatives))
            for p, rng in zip(pos, rngs, strict=True)
        ]
    )
    row_client = np.repeat(np.arange(c, dtype=np.int64), sizes)
    row_off = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(sizes, out=row_off[1:])
    seen = np.sort(np.concatenate(pos) + row_client * n_items)  # keys (client, item)
    base = (row_client * n_items)[:, None]
    while True:
        keys = negs + base
        at = np.minimum(np.searchsorted(seen, keys), max(len(seen) - 1, 0))
        bad = seen[at] == keys if len(seen) else np.zeros(negs.shape, dtype=bool)
        bad |= repeated_in_row(negs)
        per_row = np.count_nonzero(bad, axis=1)
        if not per_row.any():
            break
        n_bad = np.bincount(row_client, weights=per_row, minlength=c).astype(np.int64)
        for k in np.flatnonzero(n_bad).tolist():
            a, b = int(row_off[k]), int(row_off[k + 1])
            block = negs[a:b]
            block[bad[a:b]] = draw_items(rngs[k], n_items, pool, int(n_bad[k]))
    out = []
    labels_of: dict[int, np.ndarray] = {}
    for k, p in enumerate(pos):
        n = len(p)
        items = np.concatenate([p[:, None], negs[row_off[k] : row_off[k + 1]]], axis=1)
        if n not in labels_of:
            lab = np.zeros((n, 1 + n_negatives), dtype=np.float32)
            lab[:, 0] = 1.0
            labels_of[n] = lab.reshape(-1)
        out.append((items.reshape(-1), labels_of[n].copy()))
    return out
