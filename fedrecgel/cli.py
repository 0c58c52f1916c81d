"""The ``fedrec`` command line of the core: training runs with the simulator and dataset tools.

The services add their commands (worker, aggregator, recommend, up) to :data:`app` in
:mod:`services.cli`, the installed ``fedrec`` command; this module imports nothing of them.
The options of a run's settings are built from :class:`fedrecgel.config.RunParams`
(:func:`run_options`), so their defaults, bounds and help are defined once.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from fedrecgel import native
from fedrecgel.clitools import (
    DatasetOption,
    F,
    ProtocolOption,
    config_error,
    console,
    fail,
    field_options,
    load_data,
    no_earlier_outputs,
    option_flag,
    out_dir,
    parse_seeds,
    run_option_help,
)
from fedrecgel.config import DEFAULTS, ConfigError, RunParams, check
from fedrecgel.data import DataError, stats
from fedrecgel.data_cli import data_app
from fedrecgel.dp_popularity import DEFAULT_MAX_ITEMS
from fedrecgel.runreport import (
    final_line,
    plot_run,
    references,
    references_line,
    seed_line,
    summarize,
)
from fedrecgel.simulate import METHODS, RunResult, TrainConfig
from fedrecgel.train_runs import (
    BACKENDS,
    OPTIMIZER_SETTINGS,
    Backend,
    baseline_problem,
    full_ranking_refusal,
    ignored_by_optimizer,
    ray_problem,
    refuse_model_size,
    run_baseline,
    train_seeds,
    unused_optimizer_setting,
    unused_setting,
    with_backend,
    with_radii_used,
)
from fedrecgel.tune_cli import tune_command

# plain help (click's): rich's boxed panels left a 20-column help text beside the 60 run
# settings' names at 80 columns (600 lines for `fedrec train --help`, 270 plain)
app = typer.Typer(
    help="FedRecGEL: sharpness-aware federated recommendation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(data_app, name="data")


def run_options(
    exclude: tuple[str, ...] = (),
    defaults: dict[str, Any] | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
    helps: dict[str, str] | None = None,
) -> Callable[[F], F]:
    """Give a command one option per :class:`RunParams` field (but ``exclude``), with the
    field's default (or ``defaults``), help and bounds; the command receives their values as
    the dict ``run`` (to check with :func:`fedrecgel.config.check`). A setting the command's
    preset sets when none is named shows that preset's value as its default in the help."""
    from fedrecgel.presets import shown_defaults

    def default_of(name: str) -> Any:
        return (defaults or {}).get(name, RunParams.model_fields[name].default)

    names = [n for n in RunParams.model_fields if n not in exclude]
    return field_options(
        RunParams,
        names,
        "run",
        default_of,
        lambda name: run_option_help(name, (helps or {}).get(name)),
        {n: (option_flag(n), *a) for n, a in (aliases or {}).items()},
        panel="Run settings",
        shown=shown_defaults({n: default_of(n) for n in names}),
    )


def checked(values: dict[str, Any]) -> RunParams:
    """The run settings of a command, or a clear error naming the option."""
    try:
        return check(values, RunParams)
    except ConfigError as err:
        raise config_error(err) from None


#: ``fedrec train`` and ``fedrec up`` evaluate every this many rounds (and the last) unless
#: --eval-every says otherwise: the round is then chosen among every 10th, as the accuracy
#: tables choose it, and the default preset's 300 FilmTrust rounds took 47 s in process against
#: 142 s with an evaluation every round (over HTTP 287 s against 396 s: docs/RESULTS.md, "The
#: demo's settings"), to the same final figure (RunParams' own default, for a run config over
#: HTTP and the library, stays an evaluation every round)
CLI_EVAL_EVERY = 10

#: where ``fedrec train`` writes by default: the latest run's results, replaced by the next
TRAIN_OUT = Path("runs/latest")
#: what ``fedrec train`` writes in its ``--out``
TRAIN_OUTPUTS = ["results.json", "hr_ndcg.png"]

#: methods of ``fedrec train`` that are not federated: reference points (fedrecgel.baselines)
BASELINE_METHODS = ("popularity", "random", "central", "cooccurrence")


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where option ``name`` got its value (by name: typer may carry its own copy of click, so
    its enum is not ``click.core.ParameterSource``)."""
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def preset_choices(
    ctx: typer.Context,
    preset: str,
    dataset: str,
    presets_file: Path | None = None,
) -> dict[str, Any]:
    """The run settings (RunParams names) preset ``preset`` gives for ``dataset``, but those
    given on the command line; presets are the shipped ones, the user's and those of
    ``presets_file``, later ones winning. Says which preset ``tuned`` took, and warns of one
    tuned on another dataset (:func:`fedrecgel.presets.preset_note`)."""
    from fedrecgel.presets import PresetError, preset_note, run_settings

    files = [presets_file] if presets_file else []
    try:
        settings = run_settings(preset, dataset, *files)
    except PresetError as err:
        raise fail(str(err)) from None
    if (note := preset_note(preset, dataset, *files)) is not None:  # which, or a doubt
        console.print(note, soft_wrap=True, markup=False)
    given = {k for k in settings if _source(ctx, k) == "COMMANDLINE"}
    if "dp_clip" in given:  # a clip norm named on the command line is the run's, fixed
        given.add("dp_clip_quantile")
    return {k: v for k, v in settings.items() if k not in given}


def _apply_preset(
    ctx: typer.Context,
    base: TrainConfig,
    preset: str | None,
    dataset: str,
    presets_file: Path | None = None,
) -> TrainConfig:
    """``base`` with the preset's settings, except those given on the command line; refuses a
    server-optimizer setting given on the command line that the optimizer in effect (the
    option's, the preset's or the default) ignores."""
    chosen = {} if preset is None else preset_choices(ctx, preset, dataset, presets_file)
    try:
        config = base.replace(**chosen)
    except ValueError as err:
        raise fail(f"preset {preset}: {err}") from None
    named = named_options(ctx, OPTIMIZER_SETTINGS)
    source = optimizer_source(ctx, preset, chosen)
    if (problem := unused_optimizer_setting(config.optimizer, source, named)) is not None:
        raise fail(problem)
    return config.replace(**ignored_by_optimizer(config.optimizer, config.model_dump()))


def optimizer_source(ctx: typer.Context, preset: str | None, chosen: dict[str, Any]) -> str:
    """Where the run's server optimizer comes from: the option, the preset (whose ``chosen``
    settings apply) or the default."""
    if _source(ctx, "optimizer") == "COMMANDLINE":
        return "from --optimizer"
    return f"from preset {preset}" if "optimizer" in chosen else "the default"


def named_options(ctx: typer.Context, names: Iterable[str]) -> list[str]:
    """The settings among ``names`` given on the command line."""
    return [n for n in names if _source(ctx, n) == "COMMANDLINE"]


@app.command()
@run_options(
    exclude=("kind", "seed", "dataset", "deadline_s", "quorum"),
    defaults={"eval_every": CLI_EVAL_EVERY},
    aliases={"optimizer": ("--server-optimizer",)},
)
def train(
    ctx: typer.Context,
    run: dict[str, Any],
    dataset: DatasetOption = DEFAULTS.dataset,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder with <dataset>/<raw file> (env FEDREC_DATA_DIR). FilmTrust ships inside."
        ),
    ] = None,
    protocol: ProtocolOption = "paper",
    split_dir: Annotated[
        Path | None,
        typer.Option(
            help="Train and evaluate on a ready split instead: NCF layout (<name>.train.csv, "
            "<name>.test.negative) or the original's (train_interactions.csv, "
            "test_neg_interactions). With --validation a seeded training item per user is "
            "held out for validation."
        ),
    ] = None,
    method: Annotated[
        str,
        typer.Option(help=f"One of {', '.join(METHODS + BASELINE_METHODS)}."),
    ] = "fedrecgel",
    preset: Annotated[
        str | None,
        typer.Option(
            help="Settings by name: default (what runs without this option: chosen across "
            "the shipped datasets on validation only), paper (the authors' settings), tuned "
            "(this dataset's, else the default) or tuned-<dataset>; options given "
            "on the command line win."
        ),
    ] = None,
    presets_file: Annotated[
        Path | None,
        typer.Option(
            help="A presets file of your own (fedrec tune --presets-file), read after the "
            "shipped presets and those in the user's configuration folder."
        ),
    ] = None,
    central_lr: Annotated[
        float | None,
        typer.Option(help="Adam step size of --method central (its epochs: --rounds)."),
    ] = None,
    seeds: Annotated[str, typer.Option(help="One seed or several, comma-separated.")] = "0",
    validation: Annotated[
        bool,
        typer.Option(help="Hold out each user's second-latest item to select the round honestly."),
    ] = True,
    out: Annotated[
        Path,
        typer.Option(
            help=f"Folder for results.json and the plot (those of an earlier run there are "
            f"replaced only with --overwrite, or in {TRAIN_OUT}, which holds the latest run)."
        ),
    ] = TRAIN_OUT,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the results.json and plot an earlier run left in --out.")
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    full_ranking: Annotated[
        bool,
        typer.Option(
            help="Also rank the served round's model over the whole catalogue (each held-out "
            "item against every item its user has not interacted with, as a served top-k is), "
            "beside popularity: results.json's full_ranking. In process, with validation."
        ),
    ] = False,
    backend: Annotated[
        str,
        typer.Option(
            help="inprocess: every client in this process; ray: one Ray actor per shard of "
            "users (Ray: the distributed extra), on a local Ray or the cluster at --address."
        ),
    ] = "inprocess",
    address: Annotated[
        str | None,
        typer.Option(
            help="--backend ray: the cluster to join (auto: the one `ray start --head` started "
            "on this machine, or host:port); without it a local Ray starts for the run."
        ),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Users split by id % shards: with --backend ray one actor each (default 2); "
            "in process the groups the client step is computed in (default 1; with "
            "--upload-grouping worker the ray run's numbers, bit for bit).",
        ),
    ] = None,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(
            help="--backend ray: where the shard actors checkpoint their users' private state "
            "after each round (default <out>/ray-checkpoints; on a cluster of several "
            "machines, a folder they all see)."
        ),
    ] = None,
    dp_max_items: Annotated[
        int | None,
        typer.Option(
            help=f"--method popularity with --target-epsilon or --dp-noise: each user counts at "
            f"most this many of its training items, drawn with a seeded stream (default "
            f"{DEFAULT_MAX_ITEMS}; the noise std is z*sqrt of it).",
        ),
    ] = None,
) -> None:
    """Train in process, on Ray actors, or a reference point.

    Writes results.json and hr_ndcg.png to --out."""
    backend_of = _backend_of(backend, address, checkpoint_dir)
    _refuse_unused_options(method, central_lr, preset, presets_file)
    seed_list = parse_seeds(seeds)
    params = _checked_seeds(run, seed_list)
    federated = method not in BASELINE_METHODS
    _refuse_run_conflicts(ctx, run, method, federated, backend, shards, dp_max_items)
    if full_ranking and (why := full_ranking_refusal(method, federated, backend, validation)):
        raise fail(f"--full-ranking ranks the model a federated run serves in process: {why}")
    try:
        base = TrainConfig.from_params(
            params,
            method=method if federated else "fedrecgel",
        )
        split = load_data(dataset, data_dir, validation, protocol, split_dir)
    except (DataError, ValueError) as err:
        raise fail(str(err)) from None
    if preset is None and federated:
        # no preset named: the settings that learn across datasets, or under DP the ones that
        # keep noise and signal in proportion
        preset = "private" if base.dp_enabled else "default"
    base = with_backend(
        _apply_preset(ctx, base, preset, split.name, presets_file), backend_of, shards
    )
    base = with_radii_used(base)  # results.json records the radii the method ran with
    refuse_model_size(method, base, split.n_items)
    # before training: a folder that cannot be written, or holds results, fails now
    no_earlier_outputs(out, TRAIN_OUTPUTS, overwrite or out.resolve() == TRAIN_OUT.resolve())
    out_dir(out)
    console.print(
        f"{split.name}: {split.n_users} users, {split.n_items} items, "
        f"{split.n_train} training interactions; method {method}"
        + (
            f", rho_sh={base.effective_rho()[0]}, rho_ns={base.effective_rho()[1]}"
            if federated
            else ""
        )
        + (f", preset {preset}" if preset else "")
    )
    results: list[RunResult] = []
    if not federated:
        results = run_baseline(method, split, base, seed_list, central_lr, dp_max_items)
    if federated:
        results = train_seeds(split, base, seed_list, backend_of, out, quiet, full_ranking)
    for res in results:
        console.print(seed_line(res))
    summary = summarize(results)
    refs = references(split, results) if federated or method == "cooccurrence" else None
    payload: dict[str, Any] = {
        "dataset": split.name,
        "method": method,
        "backend": backend if federated else None,
        "protocol": "split-dir" if split_dir is not None else protocol,
        "preset": preset,
        "data": stats(split),
        "validation": validation,
        "summary": summary,
        **({"references": refs} if refs else {}),
        "runs": [r.to_json() for r in results],
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    plotted = bool((base.eval_every and federated) or method == "central")
    if plotted:
        plot_run(results, out / "hr_ndcg.png")
    else:  # an earlier run's plot beside these results would pass for theirs
        (out / "hr_ndcg.png").unlink(missing_ok=True)
    if "best_test.hr@10.mean" in summary:
        console.print(final_line(summary, results))
    if refs:
        console.print(references_line(refs))
    console.print(
        f"wrote {out / 'results.json'}" + (f" and {out / 'hr_ndcg.png'}" if plotted else "")
    )


def _backend_of(backend: str, address: str | None, checkpoint_dir: Path | None) -> Backend:
    """``fedrec train``'s --backend with its options, refusing those of ray on another."""
    if backend not in BACKENDS:
        raise fail(f"--backend must be one of {', '.join(BACKENDS)}")
    for name, value in (("--address", address), ("--checkpoint-dir", checkpoint_dir)):
        if value is not None and backend != "ray":
            raise fail(f"{name} is a setting of --backend ray; it would change nothing")
    return Backend(backend, address, checkpoint_dir)


def _refuse_unused_options(
    method: str, central_lr: float | None, preset: str | None, presets_file: Path | None
) -> None:
    """Refuse an unknown --method, and options that would change nothing with the others."""
    if method not in METHODS + BASELINE_METHODS:
        raise fail(f"--method must be one of {', '.join(METHODS + BASELINE_METHODS)}")
    if central_lr is not None and method != "central":
        raise fail("--central-lr is the step size of --method central; it would change nothing")
    if preset is not None and method in ("popularity", "random", "cooccurrence"):
        raise fail(f"--method {method} takes no preset's settings; --preset would change nothing")
    if presets_file is not None and preset is None:
        raise fail("--presets-file is read only with --preset (the preset to take from it)")
    if presets_file is not None and not presets_file.is_file():
        raise fail(f"--presets-file {presets_file}: no such file")


def _checked_seeds(run: dict[str, Any], seeds: list[int]) -> RunParams:
    """The run settings with the first seed, each seed checked."""
    params = checked({**run, "seed": seeds[0]})
    for seed in seeds[1:]:
        checked({**run, "seed": seed})
    return params


def _refuse_run_conflicts(
    ctx: typer.Context,
    run: dict[str, Any],
    method: str,
    federated: bool,
    backend: str,
    shards: int | None,
    dp_max_items: int | None,
) -> None:
    """Refuse run settings the method (a reference point's) or the backend cannot take, and
    those that would change nothing with the method and the other settings."""
    named = named_options(ctx, run)
    if (problem := baseline_problem(method, run, dp_max_items, named)) is not None:
        raise fail(problem)
    if shards is not None and not federated:
        raise fail(f"--shards splits the clients of a federated run; --method {method} has none")
    if backend == "ray":
        given = _source(ctx, "upload_grouping") == "COMMANDLINE"
        if (problem := ray_problem(method, federated, run, given)) is not None:
            raise fail(problem)
    if (problem := unused_setting(method, run, named)) is not None:
        raise fail(problem)


app.command("tune")(tune_command)


def main() -> None:
    """Run :data:`app` (with whatever commands were added to it)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    problem = native.check()  # FEDREC_NATIVE: a bad value or a required build that failed
    if problem is not None:
        console.print(f"[bold red]error:[/] {problem}", soft_wrap=True)
        sys.exit(2)
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
