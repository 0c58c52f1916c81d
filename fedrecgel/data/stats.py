"""Summary statistics of a split."""

from __future__ import annotations

import numpy as np

from fedrecgel.data.types import Split


def stats(split: Split) -> dict[str, float | int]:
    """Summary counts of a split: sizes, sparsity and per-user / per-item distributions."""
    held = 2 if split.val_items is not None else 1
    per_user = np.diff(split.train_indptr) + held
    all_items = [split.train_items, split.test_items]
    if split.val_items is not None:
        all_items.append(split.val_items)
    item_rows = np.bincount(np.concatenate(all_items), minlength=split.n_items)
    user_of = np.concatenate(
        [split.train_user_of_rows(), np.arange(split.n_users, dtype=np.int64)]
        + ([np.arange(split.n_users, dtype=np.int64)] if split.val_items is not None else [])
    )
    pairs = np.unique(user_of * split.n_items + np.concatenate(all_items))
    users_per_item = np.bincount(pairs % split.n_items, minlength=split.n_items)
    n_int = split.n_interactions
    cells = split.n_users * split.n_items
    out: dict[str, float | int] = {
        "users": split.n_users,
        "items": split.n_items,
        "interactions": n_int,
        "train": split.n_train,
        "test": split.n_users,
        "val": split.n_users if split.val_items is not None else 0,
        "distinct_pairs": len(pairs),
        "test_negatives_per_user": int(split.test_negatives.shape[1]),
        "density": n_int / cells if cells else 0.0,
        "sparsity": 1.0 - n_int / cells if cells else 1.0,
        "users_per_item_ratio": split.n_users / split.n_items if split.n_items else 0.0,
        "interactions_per_user_mean": float(per_user.mean()),
        "interactions_per_user_median": float(np.median(per_user)),
        "interactions_per_user_min": int(per_user.min()),
        "interactions_per_user_max": int(per_user.max()),
        "interactions_per_item_mean": float(item_rows.mean()),
        "interactions_per_item_median": float(np.median(item_rows)),
        "interactions_per_item_max": int(item_rows.max()),
        "users_per_item_mean": float(users_per_item.mean()),
        "users_per_item_median": float(np.median(users_per_item)),
        "users_per_item_max": int(users_per_item.max()),
        "items_without_interactions": int((item_rows == 0).sum()),
    }
    return out
