"""The ``fedrec`` command line of the core: training runs with the simulator and dataset tools.

The services add their commands (worker, aggregator, recommend, up) to :data:`app` in
:mod:`services.cli`, the installed ``fedrec`` command; this module imports nothing of them.
The options of a run's settings are built from :class:`fedrecgel.config.RunParams`
(:func:`run_options`), so their defaults, bounds and help are defined once.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import statistics
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedrecgel.config import DEFAULTS, ConfigError, RunParams, bounds, check
from fedrecgel.data import DATASETS, DataError, Split, load_csv, load_split, stats
from fedrecgel.simulate import METHODS, RoundRecord, RunResult, Simulator, TrainConfig, with_seed

app = typer.Typer(
    help="FedRecGEL: sharpness-aware federated recommendation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Dataset tools.", no_args_is_help=True)
app.add_typer(data_app, name="data")
console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a clear error and return the exit to raise."""
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


F = TypeVar("F", bound=Callable[..., Any])


def _option_type(annotation: Any) -> Any:
    """The command-line type of a field: Literals are strings (checked by the model)."""
    if get_origin(annotation) is Literal:
        return str
    if get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return _option_type(inner[0]) | None
    return annotation


def _option_help(name: str, text: str | None) -> str:
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


def run_options(
    exclude: tuple[str, ...] = (),
    defaults: dict[str, Any] | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
    helps: dict[str, str] | None = None,
) -> Callable[[F], F]:
    """Give a command one option per :class:`RunParams` field (but ``exclude``), with the
    field's default (or ``defaults``), help and bounds; the command receives their values as
    the dict ``run`` (to check with :func:`fedrecgel.config.check`)."""
    names = [n for n in RunParams.model_fields if n not in exclude]

    def decorate(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "run"]
        added = []
        for name in names:
            field = RunParams.model_fields[name]
            option = typer.Option(
                option_flag(name),
                *(aliases or {}).get(name, ()),
                help=_option_help(name, (helps or {}).get(name)),
                rich_help_panel="Run settings",
            )
            added.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=(defaults or {}).get(name, field.default),
                    annotation=Annotated[_option_type(field.annotation), option],
                )
            )

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            run = {n: kwargs.pop(n) for n in names}
            return func(run=run, **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


def checked(values: dict[str, Any]) -> RunParams:
    """The run settings of a command, or a clear error naming the option."""
    try:
        return check(values, RunParams)
    except ConfigError as err:
        raise fail(f"{option_flag(err.field)}: {err.reason}") from None


def _load(dataset: str, data_dir: Path | None, validation: bool) -> Split:
    """A dataset by name, or a ``user,item[,timestamp]`` CSV file by path."""
    path = Path(dataset)
    if dataset not in DATASETS and path.suffix.lower() in (".csv", ".txt", ".tsv"):
        from fedrecgel.data import apply_protocol

        sep = "\t" if path.suffix.lower() == ".tsv" else ","
        return apply_protocol(load_csv(path, sep=sep), validation=validation)
    return load_split(dataset, data_dir, validation=validation)


def _parse_seeds(seeds: str) -> list[int]:
    try:
        out = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    if not out:
        raise fail("--seeds is empty")
    return out


def plot_run(results: list[RunResult], path: Path) -> None:
    """HR@10 and NDCG@10 per round (one line per seed) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for res in results:
        rounds = [r.round for r in res.rounds if r.test]
        seed = res.config["seed"]
        for ax, key in zip(axes, ("hr@10", "ndcg@10"), strict=True):
            (line,) = ax.plot(
                rounds, [r.test[key] for r in res.rounds if r.test], label=f"seed {seed} test"
            )
            if any(r.val for r in res.rounds):
                ax.plot(
                    rounds,
                    [r.val[key] for r in res.rounds if r.test],
                    linestyle=":",
                    color=line.get_color(),
                    label=f"seed {seed} validation",
                )
    for ax, key in zip(axes, ("HR@10", "NDCG@10"), strict=True):
        ax.set_xlabel("round")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    cfg = results[0].config
    fig.suptitle(
        f"{results[0].dataset}: {cfg['method']} (rho_sh={cfg['rho_sh']}, rho_ns={cfg['rho_ns']})"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """Mean and std over seeds of the best-test and validation-selected figures."""
    out: dict[str, Any] = {}
    for kind, getter in (("best_test", RunResult.best_test), ("selected", RunResult.selected)):
        rows = [getter(r) for r in results]
        if any(row is None for row in rows):
            continue
        for key in ("hr@10", "ndcg@10", "hr@5", "ndcg@5", "hr@20", "ndcg@20"):
            vals = [float(row[key]) for row in rows if row is not None]
            out[f"{kind}.{key}.mean"] = statistics.fmean(vals)
            out[f"{kind}.{key}.std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return out


@app.command()
@run_options(
    exclude=("kind", "seed", "dataset", "deadline_s", "quorum"),
    aliases={"optimizer": ("--server-optimizer",)},
)
def train(
    run: dict[str, Any],
    dataset: Annotated[
        str, typer.Option(help=f"One of {', '.join(DATASETS)}, or a CSV path.")
    ] = DEFAULTS.dataset,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder with <dataset>/<raw file> (env FEDREC_DATA_DIR). FilmTrust ships inside."
        ),
    ] = None,
    method: Annotated[str, typer.Option(help=f"One of {', '.join(METHODS)}.")] = "fedrecgel",
    seeds: Annotated[str, typer.Option(help="One seed or several, comma-separated.")] = "0",
    validation: Annotated[
        bool,
        typer.Option(help="Hold out each user's second-latest item to select the round honestly."),
    ] = True,
    eval_every: Annotated[int, typer.Option(min=0)] = 1,
    out: Annotated[Path, typer.Option(help="Folder for results.json and the plot.")] = Path(
        "runs/latest"
    ),
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Train with the in-process simulator; write results.json and hr_ndcg.png to --out."""
    seed_list = _parse_seeds(seeds)
    params = checked({**run, "seed": seed_list[0]})
    for seed in seed_list[1:]:
        checked({**run, "seed": seed})
    base = TrainConfig.from_params(params, method=method, eval_every=eval_every)
    rounds = base.rounds
    try:
        base.validate()
        split = _load(dataset, data_dir, validation)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    console.print(
        f"{split.name}: {split.n_users} users, {split.n_items} items, "
        f"{split.n_train} training interactions; method {method}, "
        f"rho_sh={base.effective_rho()[0]}, rho_ns={base.effective_rho()[1]}"
    )
    results: list[RunResult] = []
    for seed in seed_list:
        cfg = with_seed(base, seed)
        sim = Simulator(split, cfg)
        with Progress(
            TextColumn(f"seed {seed}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            disable=quiet,
        ) as progress:
            task = progress.add_task("train", total=rounds, info="")

            def on_round(rec: RoundRecord, task: Any = task, progress: Progress = progress) -> None:
                hr = f" HR@10 {rec.test['hr@10']:.4f}" if rec.test else ""
                progress.update(task, advance=1, info=f"round {rec.round} loss {rec.loss:.4f}{hr}")

            res = sim.run(on_round)
        results.append(res)
        best, sel = res.best_test(), res.selected()
        line = f"seed {seed}: {res.wall_seconds:.1f}s"
        if best:
            line += (
                f"; best test round {best['round']}: HR@10 {best['hr@10']:.4f} "
                f"NDCG@10 {best['ndcg@10']:.4f}"
            )
        if sel:
            line += (
                f"; validation-selected round {sel['round']}: HR@10 {sel['hr@10']:.4f} "
                f"NDCG@10 {sel['ndcg@10']:.4f}"
            )
        console.print(line)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    payload: dict[str, Any] = {
        "dataset": split.name,
        "data": stats(split),
        "validation": validation,
        "summary": summary,
        "runs": [r.to_json() for r in results],
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    if eval_every:
        plot_run(results, out / "hr_ndcg.png")
    if "best_test.hr@10.mean" in summary:
        console.print(
            f"final: HR@10 {summary['best_test.hr@10.mean']:.4f} "
            f"NDCG@10 {summary['best_test.ndcg@10.mean']:.4f} (best test round, mean of "
            f"{len(results)} seed(s))"
            + (
                f"; validation-selected HR@10 {summary['selected.hr@10.mean']:.4f} "
                f"NDCG@10 {summary['selected.ndcg@10.mean']:.4f}"
                if "selected.hr@10.mean" in summary
                else ""
            )
        )
    console.print(
        f"wrote {out / 'results.json'}" + (f" and {out / 'hr_ndcg.png'}" if eval_every else "")
    )


@data_app.command("stats")
def data_stats(
    dataset: Annotated[
        str, typer.Argument(help=f"One of {', '.join(DATASETS)}, or a CSV path.")
    ] = "filmtrust",
    data_dir: Annotated[Path | None, typer.Option(help="Folder with the raw datasets.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Counts and sparsity of a dataset after the paper's protocol."""
    try:
        split = _load(dataset, data_dir, validation=False)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    st = stats(split)
    if as_json:
        typer.echo(json.dumps(st, indent=1))
        return
    table = Table(title=f"{split.name} after the protocol")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in st.items():
        table.add_row(k, f"{v:,.4f}" if isinstance(v, float) else f"{v:,}")
    Console().print(table)


@data_app.command("export")
def data_export(
    dataset: Annotated[str, typer.Argument(help=f"One of {', '.join(DATASETS)}.")],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    data_dir: Annotated[Path | None, typer.Option()] = None,
    validation: Annotated[bool, typer.Option()] = False,
) -> None:
    """Write the ready split in the NCF train / test-negative layout."""
    from fedrecgel.data import write_ncf

    try:
        split = _load(dataset, data_dir, validation)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    write_ncf(split, out)
    console.print(f"wrote {split.name} split to {out}")


def main() -> None:
    """Run :data:`app` (with whatever commands were added to it)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
