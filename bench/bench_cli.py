"""What the benchmark programs share on their command line, typer's as ``fedrec``'s: counts that
must be positive, comma-separated numbers, a result file that can be written (checked before the
run, not after it), and input the user got wrong (an unknown dataset, a setting out of its bounds,
a file that is not there) answered with a clear error and a non-zero exit instead of a traceback.
A program's ``main`` is a typer command (options as its annotated parameters); ``run(main)``
runs it."""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Any, NewType, TypeVar, cast

import typer
from pydantic import ValidationError
from rich.markup import escape

from fedrecgel import clitools
from fedrecgel.config import ConfigError
from fedrecgel.data import DataError, Split, load_split
from fedrecgel.data.protocol import Protocol

#: the repository's root, the folder a benchmark's child process runs in (``bench`` imports
#: from there: it is a package of the repository, not of the installed project)
ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")
J = TypeVar("J")
R = TypeVar("R")
Ints = NewType("Ints", list[int])
Floats = NewType("Floats", list[float])


def child_command(program_file: str) -> list[str]:
    """The start of the command line that runs a benchmark program again as a child process
    (``python -m bench.NAME``, given the program's ``__file__``); run it with ``cwd=ROOT``."""
    return [sys.executable, "-m", f"bench.{Path(program_file).stem}"]


def fail(message: str) -> typer.Exit:
    """``fedrec``'s error exit (``raise fail(...)``: ``error: message``, status 2) for a check of
    the options that a parser cannot make; the message is plain text, not console markup."""
    return clitools.fail(escape(message))


def cli_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An option's parser from ``parse`` (text to value; its ``ValueError`` is the usage error's
    message); a default that is not text is the value itself, unparsed."""

    @functools.wraps(parse)
    def parser(text: str) -> T:
        if not isinstance(text, str):
            return text
        try:
            return parse(text)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None

    return parser


@cli_type
def positive(text: str) -> int:
    """An integer >= 1 (rounds, repeats)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _numbers(text: str, kind: Callable[[str], T], what: str) -> list[T]:
    try:
        out = [kind(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"not comma-separated {what}: {text!r}") from None
    if not out:
        raise ValueError("empty list")
    return out


int_list = cli_type(lambda text: Ints(_numbers(text, int, "integers")))
int_list.__doc__ = "Comma-separated integers, at least one."
float_list = cli_type(lambda text: Floats(_numbers(text, float, "numbers")))
float_list.__doc__ = "Comma-separated numbers, at least one."


@cli_type
def writable_file(text: str) -> Path:
    """A file path whose folder exists (created if needed) and can be written, so that a
    benchmark does not run for minutes to fail at writing its result."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"{path} is a folder (name the result file)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot create the folder of {path} ({err.strerror})") from None
    existed = path.exists()
    try:  # opened for appending, as the benchmark will write it; a new file is removed again
        with path.open("a"):
            pass
    except OSError as err:
        raise ValueError(f"{path} cannot be written ({err.strerror})") from None
    if not existed:
        path.unlink()
    return path


def subset(text: str, known: Iterable[str], flag: str) -> list[str]:
    """The names in comma-separated ``text``, each one of ``known``; a clear error (exit 2)
    naming ``flag`` and the choices for an unknown name or none."""
    allowed = list(known)
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    if not chosen or any(n not in allowed for n in chosen):
        raise fail(f"{flag} takes a comma-separated subset of {', '.join(allowed)}")
    return chosen


def one_of(values: Iterable[str], *decls: str, argument: bool = False, **kw: Any) -> Any:
    """An option named ``decls`` (or an argument) whose text must be one of ``values``
    (a fixed set of choices); its help shows them."""
    allowed = list(values)

    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(allowed)})")
        return text

    if argument:
        return typer.Argument(parser=cli_type(parse), help=f"One of {', '.join(allowed)}.", **kw)
    return typer.Option(*decls, parser=cli_type(parse), metavar=f"[{'|'.join(allowed)}]", **kw)


def opt(help: str | None = None, *decls: str, **kw: Any) -> Any:
    """An option with its ``help`` (its flags: ``decls``, else its parameter's name), as
    ``typer.Option`` takes them: ``points: Annotated[int, opt("points of a slice")] = 13``."""
    return typer.Option(*decls, help=help, **kw)


#: the shared options' types: ``rounds: Positive = 10``, ``out: OutFile = RESULTS``
Positive = Annotated[int, opt(parser=positive)]
IntList = Annotated[Ints, opt(parser=int_list, metavar="INTS")]
FloatList = Annotated[Floats, opt(parser=float_list, metavar="NUMBERS")]
OutFile = Annotated[Path, opt(parser=writable_file, metavar="FILE")]


def run(main: Callable[..., object]) -> None:
    """Run a benchmark's typer command ``main`` (its help: the program's docstring's first
    paragraph) on the process's arguments and exit with its status: bad options end it with
    typer's usage error, bad input found as it runs (a DataError, an out-of-bounds setting, a
    missing file) with ``error: ...``, both with status 2."""
    app = clitools.plain_app()
    app.command(help=(sys.modules[main.__module__].__doc__ or "").split("\n\n")[0])(main)
    try:
        code = clitools.run_app(app, None, f"python -m bench.{Path(sys.argv[0]).stem}")
    except (DataError, ConfigError, ValidationError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    sys.exit(code)


def default_data_dir() -> Path | None:
    """The benchmarks' data directory unless ``--data-dir`` names one: the project's sibling
    ``shared/datasets`` when it exists, else None (``$FEDREC_DATA_DIR``, and the FilmTrust copy
    the package ships)."""
    sibling = Path(__file__).resolve().parents[2] / "shared" / "datasets"
    return sibling if sibling.is_dir() else None


def validation_split(key: str, data_dir: Path | None) -> Split:
    """A shipped data set by ``NAME`` or ``NAME/PROTOCOL`` (``lastfm-2k/clean``) as a split with
    a validation item per user (an unknown protocol: DataError, which :func:`run` reports)."""
    name, _, protocol = key.partition("/")
    return load_split(name, data_dir, validation=True, protocol=cast(Protocol, protocol or "paper"))


def in_fresh_processes(fn: Callable[[J], R], jobs: list[J], workers: int = 2) -> list[R]:
    """``fn`` of each job, in order, each job in a process of its own (a job that replaces a
    module's function there leaves nothing behind for the next), at most ``workers`` at once."""
    with ProcessPoolExecutor(min(workers, len(jobs)), max_tasks_per_child=1) as ex:
        return list(ex.map(fn, jobs))


def write_result(
    out: Path,
    result: dict[str, Any],
    started: float,
    indent: int = 1,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """Write a benchmark's ``result`` to ``out`` as JSON indented by ``indent`` (``default``:
    :func:`json.dumps`'), with the machine it ran on and the seconds since ``started`` (a
    ``time.perf_counter()`` value)."""
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    full = {**result, "machine": machine, "seconds": time.perf_counter() - started}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=indent, default=default) + "\n")
