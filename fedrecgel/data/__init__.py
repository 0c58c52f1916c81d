"""Datasets and the data protocol: raw loaders, leave-one-out splits, negatives, NCF interchange.

The package is split along its seams:

* ``types``: ``Interactions`` (raw rows) and ``Split`` (the protocol's output), ``DataError``;
* ``raw``: the raw file formats (FilmTrust, Amazon-Video, Lastfm-2K, CSV) and where they are found;
* ``protocol``: user filter, re-indexing, leave-one-out, negatives (``apply_protocol``);
* ``ncf``: the NCF train / test-negative interchange layout (``write_ncf``, ``read_ncf``);
* ``stats``: summary counts of a split.

Everything public is importable from ``fedrecgel.data`` itself.
"""

from fedrecgel.data.ncf import read_ncf, read_split_dir, write_ncf
from fedrecgel.data.protocol import (
    PROTOCOLS,
    apply_protocol,
    build_split,
    hold_out_validation,
    load_split,
    sample_negatives,
)
from fedrecgel.data.raw import (
    CSV_SUFFIXES,
    DATA_DIR_ENV,
    DATASETS,
    RAW_FILES,
    csv_dataset,
    csv_has_header,
    default_data_dir,
    load_csv,
    load_raw,
    packaged_filmtrust,
    raw_path,
)
from fedrecgel.data.stats import stats
from fedrecgel.data.types import DataError, Interactions, Split

__all__ = [
    "CSV_SUFFIXES",
    "DATASETS",
    "DATA_DIR_ENV",
    "PROTOCOLS",
    "RAW_FILES",
    "DataError",
    "Interactions",
    "Split",
    "apply_protocol",
    "build_split",
    "csv_dataset",
    "csv_has_header",
    "default_data_dir",
    "hold_out_validation",
    "load_csv",
    "load_raw",
    "load_split",
    "packaged_filmtrust",
    "raw_path",
    "read_ncf",
    "read_split_dir",
    "sample_negatives",
    "stats",
    "write_ncf",
]
