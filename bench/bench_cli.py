"""What the benchmark programs share on their command line: counts that must be positive, and
input the user got wrong (an unknown dataset, a setting out of its bounds, a file that is not
there) answered with one line and a non-zero exit instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from pydantic import ValidationError

from fedrecgel.config import ConfigError
from fedrecgel.data import DataError


def positive(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (rounds, repeats)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(main: Callable[[], object]) -> None:
    """Run a benchmark's ``main``; bad input ends it with ``error: ...`` and exit status 2."""
    try:
        main()
    except (DataError, ConfigError, ValidationError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
