"""The ``fedrec`` command line: training runs, dataset statistics, and the services.

Service commands import their packages lazily, so the core library never pulls in HTTP,
database or Redis code.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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
def train(
    dataset: Annotated[
        str, typer.Option(help=f"One of {', '.join(DATASETS)}, or a CSV path.")
    ] = "filmtrust",
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder with <dataset>/<raw file> (env FEDREC_DATA_DIR). FilmTrust ships inside."
        ),
    ] = None,
    method: Annotated[str, typer.Option(help=f"One of {', '.join(METHODS)}.")] = "fedrecgel",
    rounds: Annotated[int, typer.Option(min=1)] = 100,
    fraction: Annotated[
        float, typer.Option(help="Clients per round, as a fraction of users.")
    ] = 0.1,
    rho_sh: Annotated[float, typer.Option(help="SAM radius of the shared part.")] = 0.02,
    rho_ns: Annotated[float, typer.Option(help="SAM radius of the private part.")] = 0.02,
    client_lr: Annotated[float, typer.Option()] = 0.1,
    server_lr: Annotated[float, typer.Option()] = 0.001,
    server_optimizer: Annotated[
        str, typer.Option(help="adam, sgd, fedadam, fedyogi or fedadagrad.")
    ] = "adam",
    weighting: Annotated[str, typer.Option(help="mean (faithful) or samples.")] = "mean",
    n_negatives: Annotated[int, typer.Option(min=1)] = 4,
    chunk_size: Annotated[int, typer.Option(min=1)] = 128,
    factor: Annotated[int, typer.Option(min=1)] = 32,
    layers: Annotated[int, typer.Option(min=1)] = 3,
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
    base = TrainConfig(
        method=method,  # type: ignore[arg-type]
        rounds=rounds,
        fraction=fraction,
        rho_sh=rho_sh,
        rho_ns=rho_ns,
        client_lr=client_lr,
        server_lr=server_lr,
        server_optimizer=server_optimizer,  # type: ignore[arg-type]
        weighting=weighting,  # type: ignore[arg-type]
        n_negatives=n_negatives,
        chunk_size=chunk_size,
        factor=factor,
        layers=layers,
        seed=seed_list[0],
        eval_every=eval_every,
    )
    if server_optimizer not in ("adam", "sgd", "fedadam", "fedyogi", "fedadagrad"):
        raise fail(f"unknown --server-optimizer {server_optimizer!r}")
    if weighting not in ("mean", "samples"):
        raise fail(f"--weighting must be mean or samples, got {weighting!r}")
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


PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def worker(ctx: typer.Context) -> None:
    """Run a client worker (options: `fedrec worker --help`)."""
    from services.client_sim.cli import main as worker_main

    raise typer.Exit(worker_main(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def aggregator(ctx: typer.Context) -> None:
    """Run the aggregator service (settings: FEDREC_AGG_* variables; --host, --port)."""
    from services.aggregator.__main__ import main as aggregator_main

    aggregator_main(ctx.args)


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def recommend(ctx: typer.Context) -> None:
    """Run the recommendation API (settings: FEDREC_REC_* variables)."""
    from services.recommend_api.__main__ import main as recommend_main

    recommend_main(ctx.args)


@app.command()
def up(
    dataset: Annotated[str, typer.Option(help=f"One of {', '.join(DATASETS)}.")] = "filmtrust",
    data_dir: Annotated[Path | None, typer.Option(help="Folder with the raw datasets.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Client worker processes.")] = 2,
    rounds: Annotated[int, typer.Option(min=1)] = 20,
    fraction: Annotated[float, typer.Option()] = 0.1,
    seed: Annotated[int, typer.Option()] = 0,
    rho_sh: Annotated[float, typer.Option()] = 0.02,
    rho_ns: Annotated[float, typer.Option()] = 0.02,
    aggregator_port: Annotated[int, typer.Option(min=1, max=65535)] = 8700,
    recommend_port: Annotated[int, typer.Option(min=1, max=65535)] = 8702,
    worker_http_port: Annotated[
        int, typer.Option(min=1, max=65535, help="First worker's HTTP port.")
    ] = 8710,
    workdir: Annotated[Path, typer.Option(help="SQLite files and logs.")] = Path("runs/up"),
    redis_url: Annotated[str | None, typer.Option(help="Use this Redis for events.")] = None,
    recommend: Annotated[bool, typer.Option(help="Also start the recommendation API.")] = True,
    keep_running: Annotated[
        bool, typer.Option(help="Leave the services running after training (Ctrl-C stops them).")
    ] = False,
) -> None:
    """Start the aggregator, N workers and the recommendation API locally and train."""
    from services.launcher import LaunchError, Stopped, UpOptions
    from services.launcher import up as launch

    opts = UpOptions(
        dataset=dataset,
        data_dir=data_dir,
        workers=workers,
        rounds=rounds,
        fraction=fraction,
        seed=seed,
        rho_sh=rho_sh,
        rho_ns=rho_ns,
        aggregator_port=aggregator_port,
        recommend_port=recommend_port,
        worker_http_port=worker_http_port,
        workdir=workdir,
        redis_url=redis_url,
        recommend=recommend,
        keep_running=keep_running,
    )
    try:
        launch(opts)
    except (LaunchError, DataError) as err:
        raise fail(str(err)) from None
    except Stopped as stop:
        console.print(f"stopped by {stop.name}; every service was stopped")
        raise typer.Exit(128 + stop.signum) from None


def main() -> None:
    """Entry point of the ``fedrec`` command."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
