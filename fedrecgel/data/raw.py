"""Raw dataset files: FilmTrust, Amazon-Video, Lastfm-2K and ``user,item[,timestamp]`` CSV.

Every loader returns ``Interactions`` (one row per raw line); malformed input raises ``DataError``
naming the file and the 1-based line.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedrecgel.data.types import DataError, Interactions

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

_WHERE_TO_GET = (
    "Set {env} or pass a data directory laid out as "
    "<dir>/filmtrust/ratings.txt, <dir>/amazon-video/ratings.dat, "
    "<dir>/lastfm-2k/user_taggedartists.dat. Sources: FilmTrust (Guo et al., IJCAI 2013; a copy "
    "ships with this package), Amazon-Video 'ratings.dat' from the PFedRec repository "
    "(Zhangcx19/IJCAI-23-PFedRec, data/amazon/ratings.dat), Lastfm-2K from the HetRec 2011 "
    "'hetrec2011-lastfm-2k.zip' (grouplens.org/datasets/hetrec-2011, non-commercial use)."
)


def read_fields(
    path: Path,
    sep: str,
    n_fields: int | tuple[int, ...],
    header: bool,
    quoted: bool = False,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Read a delimited file as strings; return the table and each row's 1-based line number.

    Blank lines are skipped; a row with a wrong number of fields raises DataError. ``quoted``: a
    field may be quoted (a CSV's may; the datasets' raw files quote nothing).
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
            quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE,
            engine="c",
        )
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty (no data rows)") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
        if m:
            raise DataError(
                f"{path}, line {m.group(2)}: expected {m.group(1)} field"
                f"{'s' * (m.group(1) != '1')}, saw {m.group(3)}"
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
            field = int(np.flatnonzero(empty[row])[0]) + 1
            if got in allowed:  # e.g. "a,b," where two or three fields are allowed
                raise DataError(
                    f"{path}, line {lines[row]}: field {field} of {n_cols} is empty (each row "
                    f"has {_fmt_counts(allowed)} non-empty fields, all rows the same number)"
                )
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


def int_column(col: pd.Series, path: Path, lines: np.ndarray, what: str) -> np.ndarray:
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


def id_column(col: pd.Series) -> np.ndarray:
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
    stamps: np.ndarray = base.astype(np.int64) * 10**6 + _running_index(users)
    return stamps


def _load_filmtrust(path: Path) -> Interactions:
    df, lines = read_fields(path, r"\s+", 3, header=False)
    users = int_column(df[0], path, lines, "user id")
    items = int_column(df[1], path, lines, "item id")
    _check_numeric(df[2], path, lines, "rating")
    return Interactions("filmtrust", users, items, _filmtrust_timestamps(users))


def _load_amazon(path: Path) -> Interactions:
    df, lines = read_fields(path, ",", 4, header=False)
    users = df[0].str.strip().to_numpy(dtype=object)
    items = df[1].str.strip().to_numpy(dtype=object)
    _check_numeric(df[2], path, lines, "rating")
    ts = int_column(df[3].str.strip(), path, lines, "timestamp")
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
    df, lines = read_fields(path, "\t", 6, header=True)
    cols = [int_column(df[i], path, lines, LASTFM_HEADER[i]) for i in range(6)]
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
    return (
        Path(__file__).resolve().parent.parent / "datasets" / "filmtrust" / RAW_FILES["filmtrust"]
    )


#: a name that may stand for a CSV of the data directory: no folder, no leading dot
CSV_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: suffixes of such a CSV (a ``.tsv`` is tab-separated)
CSV_SUFFIXES = (".csv", ".tsv", ".txt")


def csv_dataset(name: str, data_dir: Path) -> Path | None:
    """The CSV that stands for dataset ``name`` in ``data_dir``: ``<dir>/<name>.csv`` (or
    ``.tsv``, ``.txt``), ``<dir>/<name>/<name>.csv`` or, when ``name`` ends in one of those,
    ``<dir>/<name>``; None when there is none (or ``name`` is not a plain file name)."""
    if name in RAW_FILES or not CSV_DATASET_NAME.fullmatch(name):
        return None
    stem = name[: -len(Path(name).suffix)] if Path(name).suffix.lower() in CSV_SUFFIXES else name
    places = [data_dir / name] if stem != name else []
    places += [data_dir / f"{stem}{suffix}" for suffix in CSV_SUFFIXES]
    places += [data_dir / stem / f"{stem}{suffix}" for suffix in CSV_SUFFIXES]
    return next((place for place in places if place.is_file()), None)


def raw_path(name: str, data_dir: Path | None = None) -> Path:
    """Where the raw file of dataset ``name`` is looked up (see ``load_raw``): in ``data_dir``
    (default: FEDREC_DATA_DIR), FilmTrust also in the package when the folder has none; a name
    of no known dataset is a CSV of that folder (:func:`csv_dataset`)."""
    if data_dir is None:
        data_dir = default_data_dir()
    if name not in RAW_FILES:
        found = csv_dataset(name, Path(data_dir)) if data_dir is not None else None
        if found is None:
            file = name if Path(name).suffix.lower() in CSV_SUFFIXES else f"{name}.csv"
            where = (
                f"no {file} in the data directory {data_dir}"
                if data_dir is not None
                else f"no data directory ({DATA_DIR_ENV} is unset) to hold {file}"
            )
            raise DataError(
                f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}, or a CSV of "
                f"the data directory by its name ({where})"
            )
        return found
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
    if name == "filmtrust":  # a data directory for the other datasets need not hold it
        return packaged_filmtrust()
    raise DataError(
        f"{nested}: file not found for dataset {name!r}. " + _WHERE_TO_GET.format(env=DATA_DIR_ENV)
    )


def load_raw(name: str, data_dir: Path | None = None) -> Interactions:
    """Load the raw rows of a known dataset (FilmTrust falls back to the packaged copy), or of
    the CSV that stands for ``name`` in the data directory (:func:`csv_dataset`)."""
    path = raw_path(name, data_dir)
    if name not in _LOADERS:
        return load_csv(path, sep="\t" if path.suffix.lower() == ".tsv" else ",", name=name)
    return _LOADERS[name](path)


#: header names of a CSV's columns by what they hold (compared lower-case, without quotes,
#: spaces, ``_`` and ``-``): a header of names is read by name, other columns ignored
USER_COLUMNS = frozenset({"user", "userid", "uid", "users", "customerid", "reviewerid"})
ITEM_COLUMNS = frozenset(
    {"item", "itemid", "iid", "items", "movieid", "artistid", "productid", "asin", "trackid"}
    | {"bookid", "isbn", "songid"}
)
TIME_COLUMNS = frozenset({"timestamp", "time", "ts", "date", "datetime", "unixreviewtime"})
#: names of columns a CSV may carry that training does not read (every row is a positive)
IGNORED_COLUMNS = frozenset({"rating", "ratings", "score", "weight", "count", "playcount"})
#: column names that mark a first row as a header
HEADER_NAMES = USER_COLUMNS | ITEM_COLUMNS | TIME_COLUMNS | IGNORED_COLUMNS


def _column_name(field: str) -> str:
    return re.sub(r"[\s_\-]", "", field.strip().strip('"').lower())


def _first_rows(path: Path, sep: str) -> list[list[str]]:
    """The first two rows of a CSV, fields split as the csv module splits them (quotes)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as fh:
            lines = [fh.readline(), fh.readline()]
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text file ({e})") from None
    return [next(csv.reader([ln.rstrip("\r\n")], delimiter=sep), []) for ln in lines]


def csv_columns(header: list[str], path: Path) -> tuple[int, int, int | None] | None:
    """The user, item and timestamp (None: row order) columns a CSV's ``header`` (its first
    row's fields) names, or None when none of its names is a known one (then the columns are
    ``user,item[,timestamp]`` in this order). DataError naming ``path`` when the names do not
    say which column is the user's or the item's."""
    names = [_column_name(f) for f in header]
    if not any(n in HEADER_NAMES for n in names):
        return None
    found = {
        role: [k for k, n in enumerate(names) if n in known]
        for role, known in (("user", USER_COLUMNS), ("item", ITEM_COLUMNS), ("time", TIME_COLUMNS))
    }
    if len(found["user"]) != 1 or len(found["item"]) != 1 or len(found["time"]) > 1:
        raise DataError(
            f"{path}, line 1: the header {','.join(names)} does not name one user column, one "
            "item column and at most one timestamp column: name them user, item and timestamp "
            f"(known names: {', '.join(sorted(USER_COLUMNS | ITEM_COLUMNS | TIME_COLUMNS))}; "
            "columns of other names are ignored)"
        )
    return found["user"][0], found["item"][0], found["time"][0] if found["time"] else None


def _is_int(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return False
    return True


def csv_has_header(path: Path, sep: str = ",") -> bool:
    """Whether the first row of a ``user,item[,timestamp]`` file is a header.

    It is when every field of it is a known column name (``user,item,timestamp``,
    ``userId,movieId``, ...) or two are (``reviewerID,asin,overall``), or when its timestamp
    field is not an integer while the second row's is, or when its ids are not integers while
    the second row's are.
    """
    first, second = _first_rows(Path(path), sep)
    known = sum(_column_name(f) in HEADER_NAMES for f in first)
    if first and (known == len(first) or known >= 2):
        return True
    if len(second) != len(first):
        return False
    return any(
        not _is_int(a) and _is_int(b)
        for k, (a, b) in enumerate(zip(first, second, strict=True))
        if k != 2 or len(first) == 3
    )


def load_csv(
    path: Path, sep: str = ",", header: bool | None = None, name: str | None = None
) -> Interactions:
    """Load interaction rows; without a timestamp column row order is the time.

    A header of known names (``userId,movieId,rating,timestamp``, ``item,user``, ...) is read by
    name, other columns ignored; else the columns are ``user,item[,timestamp]``. A field may be
    quoted. ``header=None`` detects a header row (``csv_has_header``); True / False force it.
    """
    path = Path(path)
    if header is None:
        header = csv_has_header(path, sep)
    first = _first_rows(path, sep)[0] if header else []
    named = csv_columns(first, path) if header else None
    if named is None:
        df, lines = read_fields(path, sep, (2, 3), header, quoted=True)
        named = (0, 1, 2 if df.shape[1] == 3 else None)
    else:
        df, lines = read_fields(path, sep, len(first), True, quoted=True)
    user, item, time = named
    users = id_column(df[user].str.strip())
    items = id_column(df[item].str.strip())
    if time is None:
        ts = np.arange(len(df), dtype=np.int64)
    else:
        ts = time_column(df[time].str.strip(), path, lines)
    return Interactions(name if name is not None else path.stem, users, items, ts)


def time_column(col: pd.Series, path: Path, lines: np.ndarray) -> np.ndarray:
    """Timestamps: integers as they are, or ISO 8601 dates and times (as nanoseconds)."""
    numeric = pd.to_numeric(col, errors="coerce").notna().to_numpy()
    if numeric.all():
        return int_column(col, path, lines, "timestamp")
    dates = pd.to_datetime(col, errors="coerce", format="ISO8601", utc=True)
    bad = dates.isna().to_numpy()
    if numeric.any() or bad.any():
        row = int(np.flatnonzero(numeric | bad)[0])
        raise DataError(
            f"{path}, line {lines[row]}: timestamp must be an integer or an ISO 8601 date (all "
            f"rows alike), got {col.iloc[row]!r}"
        )
    return np.asarray(dates.to_numpy(dtype="datetime64[ns]").astype(np.int64))
