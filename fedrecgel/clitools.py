"""What every ``fedrec`` command shares: the error exit, the console, loading a dataset or a
ready split by what the user typed (and the --dataset option that names it), parsing seeds, and
the flag and help of a run setting's option."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin

import typer
from rich.console import Console

from fedrecgel.config import RunParams, bounds
from fedrecgel.data import (
    DATASETS,
    PROTOCOLS,
    DataError,
    Split,
    apply_protocol,
    hold_out_validation,
    load_csv,
    load_split,
    read_split_dir,
)

console = Console(stderr=True)

#: the ``--dataset`` option of the commands that load one (its default: ``DEFAULTS.dataset``)
DatasetOption = Annotated[str, typer.Option(help=f"One of {', '.join(DATASETS)}, or a CSV path.")]


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a clear error and return the exit to raise."""
    # not wrapped at 80 columns when the output is not a terminal: paths stay whole
    console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


def load_data(
    dataset: str,
    data_dir: Path | None,
    validation: bool,
    protocol: str = "paper",
    split_dir: Path | None = None,
) -> Split:
    """A dataset by name, a ``user,item[,timestamp]`` CSV file by path, or a ready split."""
    if protocol not in PROTOCOLS:
        raise DataError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if split_dir is not None:
        split = read_split_dir(split_dir)
        if validation and not split.has_validation:
            split = hold_out_validation(split)
        return split
    path = Path(dataset)
    if dataset not in DATASETS and path.suffix.lower() in (".csv", ".txt", ".tsv"):
        sep = "\t" if path.suffix.lower() == ".tsv" else ","
        return apply_protocol(
            load_csv(path, sep=sep),
            validation=validation,
            protocol=protocol,  # type: ignore[arg-type]
        )
    return load_split(dataset, data_dir, validation=validation, protocol=protocol)  # type: ignore[arg-type]


def parse_seeds(seeds: str) -> list[int]:
    try:
        out = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    if not out:
        raise fail("--seeds is empty")
    if len(set(out)) != len(out):
        raise fail(f"--seeds names a seed twice: {seeds!r} (a mean over it would count it twice)")
    return out


def out_dir(path: Path, option: str = "--out") -> Path:
    """Create the output folder ``path`` now, before any work, or fail with a clear error
    (a file in the way, no permission, a read-only file system)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise fail(f"{option} {path}: cannot create the folder ({err.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise fail(f"{option} {path}: the folder is not writable")
    return path


def no_earlier_outputs(folder: Path, names: list[str], overwrite: bool) -> None:
    """Fail when ``folder`` already holds one of the files ``names`` (an earlier run's, or
    anyone's), unless the user said ``--overwrite``."""
    there = [name for name in names if (folder / name).exists()]
    if there and not overwrite:
        raise fail(
            f"--out {folder} already holds {', '.join(there)}; choose another --out, or pass "
            "--overwrite to replace them"
        )


def run_option_help(name: str, text: str | None = None) -> str:
    """The help of the option of :class:`RunParams` field ``name``: ``text`` or the field's
    description, its choices and its bounds."""
    field = RunParams.model_fields[name]
    parts = [text or field.description or ""]
    if get_origin(field.annotation) is Literal:
        parts.append("One of " + ", ".join(map(str, get_args(field.annotation))) + ".")
    limits = bounds(name)
    if limits:
        signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        shown = {k: str(v) if isinstance(v, int) else f"{v:g}" for k, v in limits.items()}
        parts.append("[" + ", ".join(f"{signs[k]} {v}" for k, v in shown.items()) + "]")
    return " ".join(p for p in parts if p)


def option_flag(name: str) -> str:
    """The command-line flag of a :class:`RunParams` field (``rho_sh`` -> ``--rho-sh``)."""
    return "--" + name.replace("_", "-")
