"""``fedrec data``: what a dataset holds once split as ``fedrec train`` splits it, and the split
written in the NCF layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedrecgel.clitools import (
    DATASET_HELP,
    ProtocolOption,
    fail,
    load_data,
    no_earlier_outputs,
    out_dir,
)
from fedrecgel.config import DEFAULTS
from fedrecgel.data import DataError, stats

data_app = typer.Typer(help="Dataset tools.", no_args_is_help=True, rich_markup_mode=None)

DatasetArgument = Annotated[str, typer.Argument(help=DATASET_HELP)]
DataDirOption = Annotated[Path | None, typer.Option(help="Folder with the raw datasets.")]


@data_app.command("stats")
def data_stats(
    dataset: DatasetArgument = DEFAULTS.dataset,
    data_dir: DataDirOption = None,
    protocol: ProtocolOption = "paper",
    validation: Annotated[
        bool,
        typer.Option(
            help="Hold out each user's second-latest item, as fedrec train does (its counts "
            "are those fedrec train reports)."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Counts and sparsity of a dataset, split as fedrec train splits it."""
    try:
        split = load_data(dataset, data_dir, validation, protocol)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    st = stats(split)
    if as_json:
        typer.echo(json.dumps(st, indent=1))
        return
    held = "validation and test items" if validation else "test items"
    table = Table(title=f"{split.name}, {protocol} protocol, {held} held out")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in st.items():
        table.add_row(k, f"{v:,.4f}" if isinstance(v, float) else f"{v:,}")
    Console().print(table)


@data_app.command("export")
def data_export(
    dataset: DatasetArgument,
    out: Annotated[Path, typer.Option(help="Output folder.")],
    data_dir: DataDirOption = None,
    protocol: ProtocolOption = "paper",
    validation: Annotated[
        bool, typer.Option(help="Hold out a validation item per user (<name>.val.negative).")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the files of an earlier export of this dataset in --out.")
    ] = False,
) -> None:
    """Write the ready split in the NCF train / test-negative layout."""
    from fedrecgel.data import write_ncf

    try:
        split = load_data(dataset, data_dir, validation, protocol)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    suffixes = ("train.csv", "test.negative", "val.negative", "users.txt", "items.txt")
    no_earlier_outputs(out, [f"{split.name}.{s}" for s in suffixes], overwrite)
    write_ncf(split, out_dir(out))
    Console(stderr=True).print(f"wrote {split.name} split to {out}")
