"""Datasets and the data protocol: raw loaders, leave-one-out splits, negatives, NCF interchange.

The protocol (see ``docs/ALGORITHM.md``, "Data protocol", and ``docs/DATASETS.md``):

1. every raw row is a positive interaction;
2. users with fewer than ``min_interactions`` rows are dropped (items are not filtered);
3. users and items are re-indexed to ``0..n-1`` in sorted order of their ids (integer ids sort by
   value; string ids are first factorised in order of first appearance in the raw file, and those
   codes are sorted), then rows are sorted by ``(user, item)`` (stable, duplicates kept);
4. leave-one-out: each user's latest row by timestamp is the test item, ties going to the row that
   comes first in ``(user, item)`` order; with ``validation=True`` the latest of the remaining rows
   (same tie rule) becomes the validation item; everything else is training data;
5. for each user ``n_test_negatives`` items drawn uniformly without replacement from the items the
   user never interacted with (in any row), with ``numpy.random.default_rng(seed)``; validation
   negatives are a separate, later draw from the same generator, so the test negatives do not depend
   on ``validation``.

Everything is vectorised: the negative sampler is rejection sampling over all users at once (in
fixed-size blocks of users) and never materialises a users x items matrix.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "DATASETS",
    "DataError",
    "Interactions",
    "Split",
    "apply_protocol",
    "default_data_dir",
    "load_csv",
    "load_raw",
    "load_split",
    "read_ncf",
    "stats",
    "write_ncf",
]

DATASETS: tuple[str, ...] = ("filmtrust", "amazon-video", "lastfm-2k")

#: raw file of each dataset, relative to ``<data_dir>/<name>/``
RAW_FILES: dict[str, str] = {
    "filmtrust": "ratings.txt",
    "amazon-video": "ratings.dat",
    "lastfm-2k": "user_taggedartists.dat",
}

DATA_DIR_ENV = "FEDREC_DATA_DIR"
FILMTRUST_SEED = 42
LASTFM_TZ = "Europe/Madrid"
LASTFM_HEADER = ("userID", "artistID", "tagID", "day", "month", "year")

#: users per block in the negative sampler (fixed, so results depend only on the seed)
_NEG_BLOCK = 1 << 13
#: rejection rounds before falling back to exact per-user sampling of the leftovers
_NEG_MAX_ROUNDS = 64

_WHERE_TO_GET = (
    "Set {env} or pass a data directory laid out as "
    "<dir>/filmtrust/ratings.txt, <dir>/amazon-video/ratings.dat, "
    "<dir>/lastfm-2k/user_taggedartists.dat. Sources: FilmTrust (Guo et al., IJCAI 2013; a copy "
    "ships with this package), Amazon-Video 'ratings.dat' from the PFedRec repository "
    "(Zhangcx19/IJCAI-23-PFedRec, data/amazon/ratings.dat), Lastfm-2K from the HetRec 2011 "
    "'hetrec2011-lastfm-2k.zip' (grouplens.org/datasets/hetrec-2011, non-commercial use)."
)


class DataError(ValueError):
    """Bad or missing data; the message names the file (and 1-based line) where relevant."""


def _arrays_equal(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a == b


@dataclass(frozen=True)
class Interactions:
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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Interactions):
            return NotImplemented
        return all(
            _arrays_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Interactions(name={self.name!r}, rows={len(self)})"


@dataclass(frozen=True)
class Split:
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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Split):
            return NotImplemented
        return all(
            _arrays_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Split(name={self.name!r}, n_users={self.n_users}, n_items={self.n_items}, "
            f"n_train={self.n_train}, n_test_negatives={self.test_negatives.shape[1]}, "
            f"validation={self.has_validation})"
        )


# --------------------------------------------------------------------------- raw file parsing


def _read_fields(
    path: Path, sep: str, n_fields: int | tuple[int, ...], header: bool
) -> tuple[pd.DataFrame, np.ndarray]:
    """Read a delimited file as strings; return the table and each row's 1-based line number.

    Blank lines are skipped; a row with a wrong number of fields raises DataError.
    """
    allowed = (n_fields,) if isinstance(n_fields, int) else n_fields
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        df = pd.read_csv(
            path,
            sep=sep,
            header=None,
            skiprows=1 if header else 0,
            dtype=str,
            skip_blank_lines=False,
            keep_default_na=False,
            na_values=[],
            quoting=csv.QUOTE_NONE,
            engine="c",
        )
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no data rows)") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
        if m:
            raise DataError(
                f"{path}, line {m.group(2)}: expected {m.group(1)} fields, saw {m.group(3)}"
            ) from None
        raise DataError(f"{path}: cannot parse file ({e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read file ({e})") from None
    offset = 2 if header else 1
    lines = np.arange(len(df), dtype=np.int64) + offset
    cells = df.to_numpy(dtype=object)
    if cells.size:
        empty = cells == ""
        blank = empty.all(axis=1)
        if blank.any():
            keep = ~blank
            df, cells, empty, lines = df[keep], cells[keep], empty[keep], lines[keep]
        n_cols = df.shape[1]
        if empty.any():
            row = int(np.flatnonzero(empty.any(axis=1))[0])
            got = int((~empty[row]).sum())
            raise DataError(
                f"{path}, line {lines[row]}: expected {_fmt_counts(allowed)} fields, saw {got}"
            )
        if n_cols not in allowed:
            raise DataError(
                f"{path}, line {lines[0] if len(lines) else offset}: expected "
                f"{_fmt_counts(allowed)} fields, saw {n_cols}"
            )
    if len(df) == 0:
        raise DataError(f"{path}: file is empty (no data rows)")
    df = df.reset_index(drop=True)
    df.columns = list(range(df.shape[1]))
    return df, lines


def _fmt_counts(allowed: tuple[int, ...]) -> str:
    return " or ".join(str(a) for a in allowed)


def _to_int(col: pd.Series, path: Path, lines: np.ndarray, what: str) -> np.ndarray:
    """Parse a string column as int64, raising DataError naming the first bad line."""
    values = col.to_numpy(dtype=object)
    try:
        return np.asarray(values.astype(np.int64), dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        pass
    num = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(num)
    ok[ok] = num[ok] == np.round(num[ok])
    if ok.all():
        # integral floats such as "5.0"
        return num.astype(np.int64)
    row = int(np.flatnonzero(~ok)[0])
    raise DataError(f"{path}, line {lines[row]}: {what} must be an integer, got {values[row]!r}")


def _check_numeric(col: pd.Series, path: Path, lines: np.ndarray, what: str) -> None:
    num = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(num)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}, line {lines[row]}: {what} must be numeric, got {col.iloc[row]!r}")


def _ids(col: pd.Series) -> np.ndarray:
    """Ids as int64 when every one is an integer literal, else as str objects."""
    values = col.to_numpy(dtype=object)
    try:
        return np.asarray(values.astype(np.int64), dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        return values.astype(str).astype(object)


def _running_index(keys: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... per distinct key, in row order (like pandas groupby().cumcount())."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    start = np.r_[True, sk[1:] != sk[:-1]]
    group_start = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - group_start
    return out


def _filmtrust_timestamps(users: np.ndarray) -> np.ndarray:
    base = np.random.default_rng(FILMTRUST_SEED).integers(0, 10**9, size=len(users))
    return base.astype(np.int64) * 10**6 + _running_index(users)


def _load_filmtrust(path: Path) -> Interactions:
    df, lines = _read_fields(path, r"\s+", 3, header=False)
    users = _to_int(df[0], path, lines, "user id")
    items = _to_int(df[1], path, lines, "item id")
    _check_numeric(df[2], path, lines, "rating")
    return Interactions("filmtrust", users, items, _filmtrust_timestamps(users))


def _load_amazon(path: Path) -> Interactions:
    df, lines = _read_fields(path, ",", 4, header=False)
    users = df[0].str.strip().to_numpy(dtype=object)
    items = df[1].str.strip().to_numpy(dtype=object)
    _check_numeric(df[2], path, lines, "rating")
    ts = _to_int(df[3].str.strip(), path, lines, "timestamp")
    return Interactions("amazon-video", users, items, ts)


def _madrid_midnight_ms(
    year: np.ndarray, month: np.ndarray, day: np.ndarray, path: Path, lines: np.ndarray
) -> np.ndarray:
    """Local midnight in Europe/Madrid of each date, as Unix milliseconds (vectorised).

    Ambiguous wall times take the earlier (summer-time) instant and non-existent ones are shifted
    forward, which is what ``datetime(y, m, d, tzinfo=ZoneInfo(...)).timestamp()`` gives.
    """
    dates = pd.to_datetime(
        pd.DataFrame({"year": year, "month": month, "day": day}), errors="coerce"
    )
    bad = dates.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{path}, line {lines[row]}: invalid date "
            f"(day={day[row]}, month={month[row]}, year={year[row]})"
        )
    # localise only the distinct dates (a few thousand), then map back
    uniq, inv = np.unique(dates.to_numpy(dtype="datetime64[s]"), return_inverse=True)
    local = pd.DatetimeIndex(uniq).tz_localize(
        LASTFM_TZ, ambiguous=np.ones(len(uniq), dtype=bool), nonexistent="shift_forward"
    )
    ms = np.asarray(local.as_unit("ms").asi8, dtype=np.int64)
    return ms[inv.reshape(-1)]


def _load_lastfm(path: Path) -> Interactions:
    if path.is_file():
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            first = fh.readline().strip().split("\t")
        if tuple(s.strip() for s in first) != LASTFM_HEADER:
            raise DataError(
                f"{path}, line 1: expected the header {' '.join(LASTFM_HEADER)!r} (tab separated),"
                f" got {' '.join(first)!r}"
            )
    df, lines = _read_fields(path, "\t", 6, header=True)
    cols = [_to_int(df[i], path, lines, LASTFM_HEADER[i]) for i in range(6)]
    users, items, _tags, day, month, year = cols
    ts = _madrid_midnight_ms(year, month, day, path, lines)
    return Interactions("lastfm-2k", users, items, ts)


_LOADERS = {
    "filmtrust": _load_filmtrust,
    "amazon-video": _load_amazon,
    "lastfm-2k": _load_lastfm,
}


def default_data_dir() -> Path | None:
    """The data directory from the environment variable FEDREC_DATA_DIR, or None if unset."""
    value = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def packaged_filmtrust() -> Path:
    """Path of the FilmTrust copy shipped inside the package."""
    return Path(__file__).resolve().parent / "datasets" / "filmtrust" / RAW_FILES["filmtrust"]


def raw_path(name: str, data_dir: Path | None = None) -> Path:
    """Where the raw file of dataset ``name`` is looked up (see ``load_raw``)."""
    if name not in RAW_FILES:
        raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    if data_dir is None:
        data_dir = default_data_dir()
    if data_dir is None:
        if name == "filmtrust":
            return packaged_filmtrust()
        raise DataError(
            f"dataset {name!r} needs a data directory (none given and {DATA_DIR_ENV} is unset). "
            + _WHERE_TO_GET.format(env=DATA_DIR_ENV)
        )
    data_dir = Path(data_dir)
    nested = data_dir / name / RAW_FILES[name]
    flat = data_dir / RAW_FILES[name]
    if nested.is_file():
        return nested
    if data_dir.name == name and flat.is_file():
        return flat
    raise DataError(
        f"{nested}: file not found for dataset {name!r}. " + _WHERE_TO_GET.format(env=DATA_DIR_ENV)
    )


def load_raw(name: str, data_dir: Path | None = None) -> Interactions:
    """Load the raw rows of a known dataset (FilmTrust falls back to the packaged copy)."""
    path = raw_path(name, data_dir)
    return _LOADERS[name](path)


def load_csv(
    path: Path, sep: str = ",", header: bool = False, name: str | None = None
) -> Interactions:
    """Load ``user,item[,timestamp]`` rows; without a timestamp column row order is the time."""
    path = Path(path)
    df, lines = _read_fields(path, sep, (2, 3), header=header)
    users = _ids(df[0].str.strip())
    items = _ids(df[1].str.strip())
    if df.shape[1] == 3:
        ts = _to_int(df[2].str.strip(), path, lines, "timestamp")
    else:
        ts = np.arange(len(df), dtype=np.int64)
    return Interactions(name if name is not None else path.stem, users, items, ts)


# --------------------------------------------------------------------------- the protocol


def _encode(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes whose sorted order is the protocol's id order, and the label of each code.

    Integer ids are their own codes; anything else is factorised in order of first appearance.
    Returns ``(codes, code_labels)`` where ``code_labels[c]`` is the label of code ``c`` (for
    integer ids ``code_labels`` is empty: the code itself is the label).
    """
    arr = np.asarray(labels)
    if arr.dtype.kind in "iub" or (
        arr.dtype == object and len(arr) and pd.api.types.infer_dtype(arr) == "integer"
    ):
        return arr.astype(np.int64), np.empty(0, dtype=object)
    codes, uniques = pd.factorize(arr, use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _labels_of(kept_codes: np.ndarray, code_labels: np.ndarray, original: np.ndarray) -> np.ndarray:
    if len(code_labels) == 0:
        return kept_codes.astype(np.asarray(original).dtype, copy=False)
    return code_labels[kept_codes]


def _check_holdouts(min_interactions: int, validation: bool) -> None:
    need = 3 if validation else 2
    if min_interactions < need:
        held = "a test and a validation item" if validation else "a test item"
        raise DataError(
            f"min_interactions={min_interactions} is too small: holding out {held} needs at "
            f"least {need} interactions per user (one must stay in training)"
        )


def apply_protocol(
    raw: Interactions,
    min_interactions: int = 5,
    n_test_negatives: int = 99,
    validation: bool = False,
    seed: int = 42,
) -> Split:
    """Filter users, re-index, leave-one-out (test and optional validation) and draw negatives."""
    _check_holdouts(min_interactions, validation)
    if n_test_negatives < 0:
        raise DataError(f"n_test_negatives must be >= 0, got {n_test_negatives}")
    if len(raw) == 0:
        raise DataError(f"{raw.name}: no interactions")
    u_codes, u_code_labels = _encode(raw.user_labels)
    i_codes, i_code_labels = _encode(raw.item_labels)
    ts = np.asarray(raw.timestamps, dtype=np.int64)

    uniq_u, inv_u, cnt_u = np.unique(u_codes, return_inverse=True, return_counts=True)
    keep = cnt_u[inv_u.reshape(-1)] >= min_interactions
    if not keep.any():
        raise DataError(
            f"{raw.name}: no user has at least {min_interactions} interactions "
            f"({len(uniq_u)} users, {len(raw)} rows): the split would be empty"
        )
    users_kept, users = np.unique(u_codes[keep], return_inverse=True)
    items_kept, items = np.unique(i_codes[keep], return_inverse=True)
    return build_split(
        name=raw.name,
        users=users.reshape(-1).astype(np.int64),
        items=items.reshape(-1).astype(np.int64),
        timestamps=ts[keep],
        n_users=len(users_kept),
        n_items=len(items_kept),
        user_labels=_labels_of(users_kept, u_code_labels, raw.user_labels),
        item_labels=_labels_of(items_kept, i_code_labels, raw.item_labels),
        n_test_negatives=n_test_negatives,
        validation=validation,
        rng=np.random.default_rng(seed),
    )


def build_split(
    name: str,
    users: np.ndarray,
    items: np.ndarray,
    timestamps: np.ndarray,
    n_users: int,
    n_items: int,
    user_labels: np.ndarray,
    item_labels: np.ndarray,
    n_test_negatives: int,
    validation: bool,
    rng: np.random.Generator,
    presorted: bool = False,
) -> Split:
    """Leave-one-out and negatives on rows already re-indexed to ``0..n_users-1``/``0..n_items-1``.

    Every user in ``0..n_users-1`` must have at least 2 rows (3 with validation). With
    ``presorted=True`` the rows must already be sorted by ``(user, item)``.
    """
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    if not presorted:
        order = np.lexsort((items, users))  # stable: equal (user, item) keep row order
        users, items, timestamps = users[order], items[order], timestamps[order]
        del order
    counts = np.bincount(users, minlength=n_users)
    need = 3 if validation else 2
    if len(counts) != n_users or counts.min(initial=need) < need:
        u = int(np.argmin(counts))
        raise DataError(
            f"{name}: user {np.asarray(user_labels)[u].item()!r} has {counts[u]} interactions, "
            f"fewer than the {need} needed for the held-out items"
        )
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])

    # leave-one-out, vectorised over users (rows are grouped by user, ties -> first row)
    held = np.zeros(len(users), dtype=bool)
    test_rows = _latest_rows(timestamps, indptr, held)
    held[test_rows] = True
    test_items = items[test_rows]
    val_items: np.ndarray | None = None
    if validation:
        val_rows = _latest_rows(timestamps, indptr, held)
        held[val_rows] = True
        val_items = items[val_rows]

    train_items = items[~held]
    train_indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts - (2 if validation else 1), out=train_indptr[1:])

    test_neg = sample_negatives(
        indptr, items, n_items, n_test_negatives, rng, user_labels=user_labels, name=name
    )
    val_neg: np.ndarray | None = None
    if validation:
        val_neg = sample_negatives(
            indptr, items, n_items, n_test_negatives, rng, user_labels=user_labels, name=name
        )
    return Split(
        name=name,
        n_users=int(n_users),
        n_items=int(n_items),
        train_indptr=train_indptr,
        train_items=train_items,
        test_items=test_items,
        test_negatives=test_neg,
        val_items=val_items,
        val_negatives=val_neg,
        user_labels=np.asarray(user_labels),
        item_labels=np.asarray(item_labels),
    )


def _latest_rows(timestamps: np.ndarray, indptr: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Per user, the first row (in row order) with the latest timestamp among rows not held."""
    starts = indptr[:-1]
    counts = np.diff(indptr)
    alive = ~held
    t = np.where(alive, timestamps, np.iinfo(np.int64).min)
    latest = np.maximum.reduceat(t, starts)
    is_latest = alive & (t == np.repeat(latest, counts))
    idx = np.where(is_latest, np.arange(len(t), dtype=np.int64), len(t))
    return np.asarray(np.minimum.reduceat(idx, starts), dtype=np.int64)


def _row_duplicates(cand: np.ndarray) -> np.ndarray:
    """Mask of entries equal to an earlier entry of the same row."""
    if cand.shape[1] < 2:
        return np.zeros(cand.shape, dtype=bool)
    order = np.argsort(cand, axis=1, kind="stable")
    s = np.take_along_axis(cand, order, axis=1)
    dup_sorted = np.zeros(cand.shape, dtype=bool)
    dup_sorted[:, 1:] = s[:, 1:] == s[:, :-1]
    dup = np.zeros(cand.shape, dtype=bool)
    np.put_along_axis(dup, order, dup_sorted, axis=1)
    return dup


def _in_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0:
        return np.zeros(keys.shape, dtype=bool)
    idx = np.searchsorted(sorted_keys, keys)
    np.minimum(idx, len(sorted_keys) - 1, out=idx)
    return np.asarray(sorted_keys[idx] == keys)


def sample_negatives(
    indptr: np.ndarray,
    items: np.ndarray,
    n_items: int,
    n_neg: int,
    rng: np.random.Generator,
    user_labels: np.ndarray | None = None,
    name: str = "data",
) -> np.ndarray:
    """Per user, ``n_neg`` distinct items uniformly from those absent from the user's rows.

    ``items[indptr[u]:indptr[u+1]]`` are user u's items, sorted within the user (duplicates ok).
    Vectorised rejection sampling in fixed blocks of users; returns int32 ``(n_users, n_neg)``.
    """
    n_users = len(indptr) - 1
    out = np.empty((n_users, n_neg), dtype=np.int32)
    if n_neg == 0 or n_users == 0:
        return out
    if n_items > np.iinfo(np.int32).max:
        raise DataError(f"{name}: {n_items} items do not fit the int32 negatives")
    users = np.repeat(np.arange(n_users, dtype=np.int64), np.diff(indptr))
    # distinct items per user (items sorted within user, so a change marks a new item)
    new = np.ones(len(items), dtype=bool)
    new[1:] = (items[1:] != items[:-1]) | (users[1:] != users[:-1])
    distinct = np.bincount(users[new], minlength=n_users)
    free = n_items - distinct
    if free.min() < n_neg:
        u = int(np.argmin(free))
        label = np.asarray(user_labels)[u].item() if user_labels is not None else u
        raise DataError(
            f"{name}: user {label!r} interacted with {distinct[u]} of {n_items} items, leaving "
            f"{free[u]} candidates for {n_neg} negatives"
        )
    for u0 in range(0, n_users, _NEG_BLOCK):
        u1 = min(u0 + _NEG_BLOCK, n_users)
        r0, r1 = int(indptr[u0]), int(indptr[u1])
        pos = (users[r0:r1] - u0) * n_items + items[r0:r1]  # sorted: rows are (user, item)
        base = np.arange(u1 - u0, dtype=np.int64)[:, None] * n_items
        cand = rng.integers(0, n_items, size=(u1 - u0, n_neg), dtype=np.int64)
        rows = np.arange(u1 - u0)
        sub = cand
        for _ in range(_NEG_MAX_ROUNDS):
            bad = _in_sorted(pos, base[rows] + sub) | _row_duplicates(sub)
            if not bad.any():
                rows = rows[:0]
                break
            keep_rows = bad.any(axis=1)
            rows, sub, bad = rows[keep_rows], sub[keep_rows], bad[keep_rows]
            sub[bad] = rng.integers(0, n_items, size=int(bad.sum()), dtype=np.int64)
            cand[rows] = sub
        else:
            bad = _in_sorted(pos, base[rows] + sub) | _row_duplicates(sub)
            keep_rows = bad.any(axis=1)
            rows, sub, bad = rows[keep_rows], sub[keep_rows], bad[keep_rows]
        # exact fallback for the few rows rejection did not settle (users with few free items)
        for j, r in enumerate(rows):
            u = u0 + int(r)
            taken = np.union1d(items[indptr[u] : indptr[u + 1]], sub[j][~bad[j]])
            allowed = np.setdiff1d(np.arange(n_items, dtype=np.int64), taken, assume_unique=True)
            sub[j][bad[j]] = rng.choice(allowed, size=int(bad[j].sum()), replace=False)
            cand[r] = sub[j]
        out[u0:u1] = cand
    return out


def load_split(
    name: str, data_dir: Path | None = None, validation: bool = False, seed: int = 42
) -> Split:
    """``load_raw`` followed by ``apply_protocol`` with the default protocol settings."""
    return apply_protocol(load_raw(name, data_dir), validation=validation, seed=seed)


# --------------------------------------------------------------------------- NCF interchange


def _write_negative_file(path: Path, items: np.ndarray, negatives: np.ndarray) -> None:
    n_users = len(items)
    heads = np.char.add(
        np.char.add(np.char.add("(", np.arange(n_users).astype(str)), ","),
        np.char.add(np.asarray(items).astype(str), ")"),
    )
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for u in range(n_users):
            if negatives.shape[1]:
                fh.write(heads[u] + "\t" + "\t".join(map(str, negatives[u].tolist())) + "\n")
            else:
                fh.write(heads[u] + "\n")


def write_ncf(split: Split, out_dir: Path) -> None:
    """Write ``<name>.train.csv`` (``user,item``) and ``<name>.test.negative`` in NCF layout.

    With validation, ``<name>.val.negative`` is written too (same format); the original ids go to
    ``<name>.users.txt`` / ``<name>.items.txt`` (one per line, index order) so that ``read_ncf``
    restores the split exactly.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train = pd.DataFrame({"user": split.train_user_of_rows(), "item": split.train_items})
    train.to_csv(
        out_dir / f"{split.name}.train.csv", header=False, index=False, lineterminator="\n"
    )
    _write_negative_file(
        out_dir / f"{split.name}.test.negative", split.test_items, split.test_negatives
    )
    if split.val_items is not None and split.val_negatives is not None:
        _write_negative_file(
            out_dir / f"{split.name}.val.negative", split.val_items, split.val_negatives
        )
    for suffix, labels in (("users", split.user_labels), ("items", split.item_labels)):
        with (out_dir / f"{split.name}.{suffix}.txt").open(
            "w", encoding="utf-8", newline="\n"
        ) as fh:
            fh.writelines(f"{x}\n" for x in np.asarray(labels).tolist())


_HEAD = re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")


def _read_negative_file(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    users: list[int] = []
    items: list[int] = []
    negs: list[list[int]] = []
    width: int | None = None
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            m = _HEAD.match(parts[0].strip())
            if not m:
                raise DataError(
                    f"{path}, line {lineno}: expected '(user,item)' first, got {parts[0]!r}"
                )
            try:
                row = [int(p) for p in parts[1:]]
            except ValueError:
                raise DataError(
                    f"{path}, line {lineno}: negative item ids must be integers"
                ) from None
            if width is None:
                width = len(row)
            elif len(row) != width:
                raise DataError(
                    f"{path}, line {lineno}: expected {width} negatives, saw {len(row)}"
                )
            users.append(int(m.group(1)))
            items.append(int(m.group(2)))
            negs.append(row)
    if not users:
        raise DataError(f"{path}: file is empty (no data rows)")
    u = np.asarray(users, dtype=np.int64)
    if not np.array_equal(u, np.arange(len(u))):
        raise DataError(f"{path}: expected one line per user, users 0..n-1 in order")
    return (
        u,
        np.asarray(items, dtype=np.int64),
        np.asarray(negs, dtype=np.int32).reshape(len(u), width or 0),
    )


def _read_labels(path: Path, n: int) -> np.ndarray:
    if not path.is_file():
        return np.arange(n, dtype=np.int64)
    with path.open("r", encoding="utf-8") as fh:
        values = [line.rstrip("\r\n") for line in fh]
    if len(values) != n:
        raise DataError(f"{path}: expected {n} labels, found {len(values)}")
    return _ids(pd.Series(values, dtype=object))


def read_ncf(out_dir: Path, name: str) -> Split:
    """Read a split written in NCF layout (``<name>.train.csv`` and ``<name>.test.negative``)."""
    out_dir = Path(out_dir)
    _, test_items, test_neg = _read_negative_file(out_dir / f"{name}.test.negative")
    n_users = len(test_items)
    val_items: np.ndarray | None = None
    val_neg: np.ndarray | None = None
    val_path = out_dir / f"{name}.val.negative"
    if val_path.is_file():
        _, val_items, val_neg = _read_negative_file(val_path)
        if len(val_items) != n_users:
            raise DataError(f"{val_path}: {len(val_items)} users, the test file has {n_users}")
    train_path = out_dir / f"{name}.train.csv"
    df, lines = _read_fields(train_path, ",", 2, header=False)
    tu = _to_int(df[0], train_path, lines, "user id")
    ti = _to_int(df[1], train_path, lines, "item id")
    bad = (tu < 0) | (tu >= n_users)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{train_path}, line {lines[row]}: user {tu[row]} is not in the test file "
            f"(users 0..{n_users - 1})"
        )
    order = np.argsort(tu, kind="stable")
    tu, ti = tu[order], ti[order]
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(tu, minlength=n_users), out=indptr[1:])
    user_labels = _read_labels(out_dir / f"{name}.users.txt", n_users)
    items_path = out_dir / f"{name}.items.txt"
    if items_path.is_file():
        with items_path.open("r", encoding="utf-8") as fh:
            n_items = sum(1 for _ in fh)
    else:
        parts = [ti, test_items, test_neg.reshape(-1)]
        if val_items is not None and val_neg is not None:
            parts += [val_items, val_neg.reshape(-1)]
        n_items = int(max(int(p.max()) for p in parts if len(p))) + 1
    item_labels = _read_labels(items_path, n_items)
    for what, arr in (("train", ti), ("test", test_items), ("negative", test_neg)):
        if arr.size and (arr.min() < 0 or arr.max() >= n_items):
            raise DataError(f"{out_dir / name}: {what} item ids outside 0..{n_items - 1}")
    return Split(
        name=name,
        n_users=n_users,
        n_items=n_items,
        train_indptr=indptr,
        train_items=ti,
        test_items=test_items,
        test_negatives=test_neg,
        val_items=val_items,
        val_negatives=val_neg,
        user_labels=user_labels,
        item_labels=item_labels,
    )


# --------------------------------------------------------------------------- statistics


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
