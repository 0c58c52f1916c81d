"""What the benchmark programs share on their command line: counts that must be positive, a
result file that can be written (checked before the run, not after it), and input the user got
wrong (an unknown dataset, a setting out of its bounds, a file that is not there) answered
with one line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from fedrecgel.config import ConfigError
from fedrecgel.data import DataError

#: the repository's root, the folder a benchmark's child process runs in (``bench`` imports
#: from there: it is a package of the repository, not of the installed project)
ROOT = Path(__file__).resolve().parents[1]


def child_command(program_file: str) -> list[str]:
    """The start of the command line that runs a benchmark program again as a child process
    (``python -m bench.NAME``, given the program's ``__file__``); run it with ``cwd=ROOT``."""
    return [sys.executable, "-m", f"bench.{Path(program_file).stem}"]


def positive(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (rounds, repeats)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated integers, at least one."""
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def float_list(text: str) -> list[float]:
    """An ``argparse`` type: comma-separated numbers, at least one."""
    try:
        out = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated numbers: {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def writable_file(text: str) -> Path:
    """An ``argparse`` type: a file path whose folder exists (created if needed) and can be
    written, so that a benchmark does not run for minutes to fail at writing its result."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder (name the result file)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot create the folder of {path} ({err.strerror})"
        ) from None
    existed = path.exists()
    try:  # opened for appending, as the benchmark will write it; a new file is removed again
        with path.open("a"):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{path} cannot be written ({err.strerror})") from None
    if not existed:
        path.unlink()
    return path


def run(main: Callable[[], object]) -> None:
    """Run a benchmark's ``main``; bad input ends it with ``error: ...`` and exit status 2."""
    try:
        main()
    except (DataError, ConfigError, ValidationError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def default_data_dir() -> Path | None:
    """The benchmarks' data directory unless ``--data-dir`` names one: the project's sibling
    ``shared/datasets`` when it exists, else None (``$FEDREC_DATA_DIR``, and the FilmTrust copy
    the package ships)."""
    sibling = Path(__file__).resolve().parents[2] / "shared" / "datasets"
    return sibling if sibling.is_dir() else None
