"""The two data types of the protocol: raw interactions and a leave-one-out split."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


class DataError(ValueError):
    """Bad or missing data; the message names the file (and 1-based line) where relevant."""


def _arrays_equal(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a == b


class _ArrayFields:
    """Base of a dataclass of arrays (``eq=False``): equal when every field is (arrays: the same
    shape and elements); unhashable."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, type(self)):
            return NotImplemented
        return all(
            _arrays_equal(getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)  # type: ignore[arg-type]  # a dataclass's base
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class Interactions(_ArrayFields):
    """Raw interaction rows of a dataset, before the protocol."""

    name: str
    user_labels: np.ndarray
    item_labels: np.ndarray
    timestamps: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.user_labels)
        if len(self.item_labels) != n or len(self.timestamps) != n:
            raise DataError(
                f"{self.name}: user_labels, item_labels and timestamps differ in length "
                f"({n}, {len(self.item_labels)}, {len(self.timestamps)})"
            )

    def __len__(self) -> int:
        return len(self.user_labels)

    def __repr__(self) -> str:
        return f"Interactions(name={self.name!r}, rows={len(self)})"


@dataclass(frozen=True, eq=False)
class Split(_ArrayFields):
    """A leave-one-out split; users and items are re-indexed ``0..n-1``."""

    name: str
    n_users: int
    n_items: int
    train_indptr: np.ndarray
    train_items: np.ndarray
    test_items: np.ndarray
    test_negatives: np.ndarray
    val_items: np.ndarray | None
    val_negatives: np.ndarray | None
    user_labels: np.ndarray
    item_labels: np.ndarray

    def user_train(self, u: int) -> np.ndarray:
        """Training items of user ``u`` (a view, duplicates kept, sorted by item)."""
        return self.train_items[self.train_indptr[u] : self.train_indptr[u + 1]]

    @property
    def n_train(self) -> int:
        """Number of training rows."""
        return len(self.train_items)

    @property
    def n_interactions(self) -> int:
        """Training rows plus held-out rows (test, and validation when present)."""
        held = 2 if self.val_items is not None else 1
        return self.n_train + held * self.n_users

    @property
    def has_validation(self) -> bool:
        """Whether a validation item was held out per user."""
        return self.val_items is not None

    def train_user_of_rows(self) -> np.ndarray:
        """User index of every training row (int64, aligned with ``train_items``)."""
        return np.repeat(np.arange(self.n_users, dtype=np.int64), np.diff(self.train_indptr))

    def __repr__(self) -> str:
        return (
            f"Split(name={self.name!r}, n_users={self.n_users}, n_items={self.n_items}, "
            f"n_train={self.n_train}, n_test_negatives={self.test_negatives.shape[1]}, "
            f"validation={self.has_validation})"
        )
