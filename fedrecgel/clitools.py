"""What the project's command lines share (``fedrec``'s and the services'): the error exit, the
console, loading a dataset or a ready split by what the user typed (and the --dataset option
that names it), parsing seeds, and options built from a pydantic model's fields (a run's
settings, :func:`run_option_help`; a service's, :func:`settings_options`)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from fedrecgel.config import ConfigError, RunParams
from fedrecgel.data import (
    CSV_SUFFIXES,
    DATASETS,
    PROTOCOLS,
    DataError,
    Split,
    apply_protocol,
    csv_dataset,
    default_data_dir,
    hold_out_validation,
    load_csv,
    load_split,
    read_split_dir,
)

console = Console(stderr=True)

#: the ``--dataset`` option of the commands that load one (its default: ``DEFAULTS.dataset``)
DATASET_HELP = (
    f"One of {', '.join(DATASETS)}, a CSV file's path, or NAME for a NAME.csv in the data "
    "directory."
)
DatasetOption = Annotated[str, typer.Option(help=DATASET_HELP)]
#: the --protocol option of the commands that load a raw dataset
ProtocolOption = Annotated[
    str,
    typer.Option(
        help="paper: every raw row a positive (as the original); clean: repeated user-item "
        "pairs merged (latest time) before the leave-one-out."
    ),
]


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
    folder = data_dir or default_data_dir()
    if path.suffix.lower() in CSV_SUFFIXES and (
        path.is_file() or folder is None or csv_dataset(dataset, Path(folder)) is None
    ):
        sep = "\t" if path.suffix.lower() == ".tsv" else ","
        return apply_protocol(
            load_csv(path, sep=sep),
            validation=validation,
            protocol=protocol,  # type: ignore[arg-type]
        )
    return load_split(dataset, data_dir, validation=validation, protocol=protocol)  # type: ignore[arg-type]


def by_name(dataset: str, data_dir: Path | None) -> tuple[str, Path | None]:
    """``dataset`` and ``data_dir`` as services take them, which name a dataset and never a
    path: a CSV file's path becomes its file name in its folder (:func:`csv_dataset`)."""
    path = Path(dataset)
    if path.suffix.lower() not in CSV_SUFFIXES or not path.is_file():
        return dataset, data_dir
    folder = path.resolve().parent
    if data_dir is not None and Path(data_dir).resolve() != folder:
        raise fail(
            f"--dataset {dataset} is a file of {folder}: --data-dir {data_dir} would not hold it"
        )
    if csv_dataset(path.name, folder) != folder / path.name:
        raise fail(
            f"--dataset {dataset}: the services take a CSV by its file name, which must be "
            "letters, digits, '.', '_' or '-' (rename the file)"
        )
    return path.name, folder


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


def config_error(err: ConfigError) -> typer.Exit:
    """The exit for settings that ``check`` refused: the option of the bad field, or for a rule
    across settings (no one field) the rule's own words."""
    reason = err.reason.removeprefix("Value error, ")
    if err.field == "config":
        return fail(reason)
    return fail(f"{option_flag(err.field)}: {reason}")


F = TypeVar("F", bound=Callable[..., Any])


def option_type(annotation: Any) -> Any:
    """The command-line type of a model field: X's (or None) for ``X | None``, the field's own
    when typer knows it, else a string (a Literal, a secret: checked by the model)."""
    if get_origin(annotation) in (Union, UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return option_type(inner[0]) | None
    if get_origin(annotation) is Annotated:  # a constrained type: the model checks it
        return option_type(get_args(annotation)[0])
    return annotation if annotation in (str, int, float, bool, Path) else str


def field_options(
    model: type[BaseModel],
    names: Collection[str],
    into: str,
    default_of: Callable[[str], Any],
    help_of: Callable[[str], str],
    flags: Mapping[str, tuple[str, ...]] | None = None,
    panel: str | None = None,
    build: Callable[[dict[str, Any]], Any] = dict,
    shown: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Give a command one option per field ``names`` of ``model`` (``--a-name``, ``--a-name/
    --no-a-name`` for a bool, or ``flags``'), typed as the field, with ``default_of(name)`` and
    ``help_of(name)`` (its help shows ``shown[name]`` as the default where given); the command
    receives ``build`` of their values' dict as ``into``."""

    def decorate(func: F) -> F:
        sig, keyword = inspect.signature(func, eval_str=True), inspect.Parameter.KEYWORD_ONLY
        params = [p.replace(kind=keyword) for p in sig.parameters.values() if p.name != into]
        for name in names:
            field_type, flag = model.model_fields[name].annotation, option_flag(name)
            if option_type(field_type) in (bool, bool | None):  # an on/off switch
                flag += f"/--no-{flag[2:]}"
            option = typer.Option(
                *(flags or {}).get(name, (flag,)),
                help=help_of(name),
                rich_help_panel=panel,
                show_default=(shown or {}).get(name, True),
            )
            params.append(
                inspect.Parameter(
                    name,
                    keyword,
                    default=default_of(name),
                    annotation=Annotated[option_type(field_type), option],
                )
            )

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            return func(**{into: build({n: kwargs.pop(n) for n in names})}, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


def settings_options(
    model: type[BaseModel],
    helps: Mapping[str, str],
    flags: Mapping[str, tuple[str, ...]] | None = None,
    code: int = 1,
) -> Callable[[F], F]:
    """Give a service's command one option per settings field in ``helps``: one not given leaves
    the field's environment variable or default in force, and its help names both. The command
    receives the settings as ``settings``; invalid ones end it with ``code`` after one line per
    error, ``error: --port (PREFIX_PORT): must be at most 65535, got 99999`` (a setting with no
    option: its variable alone; a rule across settings: each line of its own words)."""
    prefix = str(model.model_config.get("env_prefix", ""))
    numbers = (int, float, int | None, float | None)  # the settings whose value is shown
    #: pydantic's error types in the words of a command line (any other: its own message)
    reasons = {
        "greater_than_equal": "must be at least {ge}",
        "greater_than": "must be more than {gt}",
        "less_than_equal": "must be at most {le}",
        "less_than": "must be less than {lt}",
        "int_parsing": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "finite_number": "must be a finite number",
        "bool_parsing": "must be on or off (true or false)",
        "literal_error": "must be one of {expected}",
    }

    def as_text(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    def error_lines(err: ValidationError) -> list[str]:
        """One line per error: the setting's option and variable, and why it is refused (the
        value shown for a number only: a text setting may be a secret)."""
        lines = []
        for error in err.errors(include_url=False):
            name = str(error["loc"][0]) if error["loc"] else ""
            if name not in model.model_fields:  # a rule across settings: its own words
                lines += error["msg"].removeprefix("Value error, ").splitlines()
                continue
            template = reasons.get(error["type"])
            why = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
            if template is not None:
                why = template.format(**{k: as_text(v) for k, v in error.get("ctx", {}).items()})
            if option_type(model.model_fields[name].annotation) in numbers:
                why += f", got {as_text(error['input'])[:40] or repr(error['input'])}"
            variable = f"{prefix}{name.upper()}"
            if name in helps:
                variable = f"{(flags or {}).get(name, (option_flag(name),))[0]} ({variable})"
            lines.append(f"{variable}: {why}")
        return lines

    def help_of(name: str) -> str:
        field, note = model.model_fields[name], f"{prefix}{name.upper()}"
        if get_origin(field.annotation) is Literal:
            note = f"one of {', '.join(map(str, get_args(field.annotation)))}; {note}"
        if field.default_factory is None and field.default not in (None, ""):
            shown = field.default
            note += f"; default {('on' if shown else 'off') if isinstance(shown, bool) else shown}"
        return f"{helps[name]} ({note})"

    def build(values: dict[str, Any]) -> BaseModel:
        try:
            return model(**{name: v for name, v in values.items() if v is not None})
        except ValidationError as err:
            for line in error_lines(err):
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(code) from None

    return field_options(model, helps, "settings", lambda _: None, help_of, flags, build=build)


def plain_app() -> typer.Typer:
    """A service's one-command app: plain help and errors (its logs are not a terminal)."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


def run_app(app: typer.Typer, argv: Sequence[str] | None, prog_name: str) -> int:
    """Run ``app`` on ``argv`` (None: the process's arguments) and return its exit status (a
    usage error: 2, after its message); a ``SystemExit`` with a message passes through."""
    try:
        app(args=argv, prog_name=prog_name)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            raise
        return stop.code or 0
    return 0


def bounds(name: str, model: type[RunParams] = RunParams) -> dict[str, float]:
    """The numeric bounds of field ``name``: keys among ``ge``, ``gt``, ``le``, ``lt``."""
    out: dict[str, float] = {}
    for meta in model.model_fields[name].metadata:
        for key in ("ge", "gt", "le", "lt"):
            value = getattr(meta, key, None)
            if value is not None:
                out[key] = value
    return out
