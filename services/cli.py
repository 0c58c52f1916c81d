"""The ``fedrec`` command: the core's commands (:mod:`fedrecgel.cli`) and the services'.

Importing this module adds ``worker``, ``aggregator``, ``recommend``, ``up`` and
``enrolment-token`` to the core's :data:`~fedrecgel.cli.app`; the core imports nothing of the
services.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from fedrecgel.cli import (
    CLI_EVAL_EVERY,
    app,
    checked,
    named_options,
    optimizer_source,
    preset_choices,
    run_options,
)
from fedrecgel.cli import main as _run_app
from fedrecgel.clitools import DATASET_HELP, by_name, console, fail, option_flag
from fedrecgel.data import DataError
from fedrecgel.presets import over_http
from fedrecgel.train_runs import ignored_by_optimizer, unused_optimizer_setting, unused_setting
from services.launcher import UpOptions

__all__ = ["app", "main"]

PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _port(help: str) -> Any:
    """The option of a TCP port."""
    return typer.Option(min=1, max=65535, help=help)


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def worker(ctx: typer.Context) -> None:
    """Run a client worker (options: `fedrec worker --help`)."""
    from services.client_sim.cli import main as worker_main

    raise typer.Exit(worker_main(ctx.args))


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def aggregator(ctx: typer.Context) -> None:
    """Run the aggregator service (FEDREC_AGG_* settings)."""
    from services.aggregator.__main__ import main as aggregator_main

    aggregator_main(ctx.args, "fedrec aggregator")


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def recommend(ctx: typer.Context) -> None:
    """Run the recommendation API (FEDREC_REC_* settings)."""
    from services.recommend_api.__main__ import main as recommend_main

    recommend_main(ctx.args, "fedrec recommend")


@app.command(context_settings=PASSTHROUGH, add_help_option=False)
def dashboard(ctx: typer.Context) -> None:
    """Run the web dashboard (FEDREC_DASH_* settings)."""
    from services.dashboard.__main__ import main as dashboard_main

    dashboard_main(ctx.args, "fedrec dashboard")


#: the most worker processes ``fedrec up`` starts on one machine (each is a Python process
#: holding torch, ~0.45 GB resident: 32 of them already need 15 GB)
MAX_UP_WORKERS = 32
#: ``fedrec up``'s option defaults are UpOptions' own (stated once, there)
_UP = UpOptions()


@app.command()
@run_options(
    defaults={"eval_every": CLI_EVAL_EVERY},
    helps={"dataset": DATASET_HELP},
)
def up(
    ctx: typer.Context,
    run: dict[str, Any],
    preset: Annotated[
        str | None,
        typer.Option(
            help="Run settings of this preset (as fedrec train --preset), except the settings "
            "given as options: default (settings that learn across datasets, 300 rounds), "
            "private (what a DP run takes when none is named; its clip norm fixed, as the "
            "aggregator does not adapt it), paper (the paper's), tuned, or a tuned-<dataset> "
            "one."
        ),
    ] = None,
    presets_file: Annotated[
        Path | None,
        typer.Option(help="A presets file of your own, read after the shipped and the user's."),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder with the raw datasets.")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_UP_WORKERS,
            help="Client worker processes (each holds its own torch, about 0.45 GB).",
        ),
    ] = _UP.workers,
    aggregator_port: Annotated[int, _port("The aggregator's port.")] = _UP.aggregator_port,
    recommend_port: Annotated[int, _port("The recommendation API's port.")] = _UP.recommend_port,
    worker_http_port: Annotated[int, _port("First worker's HTTP port.")] = _UP.worker_http_port,
    dashboard_port: Annotated[int, _port("The web dashboard's port.")] = _UP.dashboard_port,
    dashboard: Annotated[bool, typer.Option(help="Also start the web dashboard.")] = _UP.dashboard,
    workdir: Annotated[
        Path,
        typer.Option(
            help="SQLite files and logs; an earlier fedrec up's there are replaced (files of those "
            "names that no fedrec up wrote are refused)."
        ),
    ] = _UP.workdir,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis for events.")
    ] = _UP.redis_url,
    database_url: Annotated[
        str | None,
        typer.Option(
            help="The aggregator's database as a SQLAlchemy URL (e.g. "
            "postgresql+psycopg://user@host/db); default: SQLite in --workdir."
        ),
    ] = _UP.database_url,
    validation: Annotated[
        bool,
        typer.Option(
            help="Hold out each user's second-latest item on the workers (as fedrec train "
            "does): the best round is chosen on it and the popularity prior's weight too."
        ),
    ] = _UP.validation,
    recommend: Annotated[
        bool, typer.Option(help="Also start the recommendation API.")
    ] = _UP.recommend,
    keep_running: Annotated[
        bool, typer.Option(help="Leave the services running after training (Ctrl-C stops them).")
    ] = _UP.keep_running,
) -> None:
    """Start the services on this machine and train over HTTP.

    The aggregator, N client workers, the recommendation API and the web dashboard (but
    --no-recommend, --no-dashboard), each a process of its own; they stop when the run ends
    (with --keep-running, at Ctrl-C)."""
    from services.supervise import LaunchError, Stopped
    from services.up import up as launch

    if presets_file is not None and not presets_file.is_file():
        raise fail(f"--presets-file {presets_file}: no such file")
    dataset = Path(str(run["dataset"])).stem  # a preset is named after the dataset
    if preset is None:
        dp = run.get("dp_noise") is not None or run.get("target_epsilon") is not None
        preset = "private" if dp else "default"
    chosen = over_http(preset_choices(ctx, preset, dataset, presets_file))
    if chosen:
        shown = ", ".join(f"{option_flag(k)} {v}" for k, v in sorted(chosen.items()))
        console.print(f"preset {preset}: {shown}", highlight=False)
    named = named_options(ctx, run)
    run = {**run, **chosen}
    problem = unused_setting("fedrecgel", run, named) or unused_optimizer_setting(
        run["optimizer"], optimizer_source(ctx, preset, chosen), named
    )
    if problem is not None:
        raise fail(problem)
    run.update(ignored_by_optimizer(run["optimizer"], run))
    run["dataset"], data_dir = by_name(str(run["dataset"]), data_dir)
    opts = UpOptions(
        run=checked(run),
        data_dir=data_dir,
        workers=workers,
        aggregator_port=aggregator_port,
        recommend_port=recommend_port,
        worker_http_port=worker_http_port,
        dashboard=dashboard,
        dashboard_port=dashboard_port,
        workdir=workdir,
        redis_url=redis_url,
        database_url=database_url,
        validation=validation,
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


ENROLMENT_SECRET_VAR = "FEDREC_AGG_ENROLMENT_SECRET"


def enrolment_secret(secret_file: Path | None) -> str:
    """The aggregator's enrolment secret: from ``secret_file``, else the file named by
    ``$FEDREC_AGG_ENROLMENT_SECRET_FILE``, else ``$FEDREC_AGG_ENROLMENT_SECRET``; ValueError
    naming what to set when none is usable, or when the aggregator would refuse it (in its
    ``$FEDREC_AGG_ENVIRONMENT``: :func:`~services.aggregator.settings.refused_secret`)."""
    from services.aggregator.settings import refused_secret
    from services.secret_files import read_secret_file
    from services.service_settings import Environment

    from_env = os.environ.get(ENROLMENT_SECRET_VAR, "").strip()
    file_env = os.environ.get(f"{ENROLMENT_SECRET_VAR}_FILE", "").strip()
    if secret_file is not None:
        secret, source = read_secret_file(secret_file, "--secret-file"), "--secret-file"
    elif from_env and file_env:
        raise ValueError(f"set {ENROLMENT_SECRET_VAR} or {ENROLMENT_SECRET_VAR}_FILE, not both")
    elif file_env:
        source = f"{ENROLMENT_SECRET_VAR}_FILE"
        secret = read_secret_file(Path(file_env), source)
    elif from_env:
        secret, source = from_env, ENROLMENT_SECRET_VAR
    else:
        raise ValueError(
            f"no enrolment secret: pass --secret-file, or set {ENROLMENT_SECRET_VAR}_FILE or "
            f"{ENROLMENT_SECRET_VAR} (the aggregator's own setting)"
        )
    environment = os.environ.get("FEDREC_AGG_ENVIRONMENT", "").strip() or "production"
    if environment not in get_args(Environment):
        raise ValueError(
            f"FEDREC_AGG_ENVIRONMENT must be one of {', '.join(get_args(Environment))}, "
            f"got {environment!r}"
        )
    why = refused_secret(secret, source, environment)
    if why is not None:
        raise ValueError(f"the aggregator would refuse this secret: {why}")
    return secret


@app.command("enrolment-token")
def enrolment_token(
    shard: Annotated[int, typer.Option(min=0, help="The worker's shard index I.")],
    shards: Annotated[int, typer.Option(min=1, help="The number of shards N.")],
    secret_file: Annotated[
        Path | None,
        typer.Option(help="File holding the aggregator's enrolment secret (default: env)."),
    ] = None,
) -> None:
    """Print the enrolment token of worker shard I of N.

    The token registers the users u % N == I; it is derived from the aggregator's enrolment
    secret ($FEDREC_AGG_ENROLMENT_SECRET[_FILE])."""
    from services.enrolment import EnrolmentTokenError
    from services.enrolment import enrolment_token as derive

    try:
        token = derive(enrolment_secret(secret_file), shard, shards)
    except (EnrolmentTokenError, ValueError) as err:
        raise fail(str(err)) from None
    typer.echo(token)


def main() -> None:
    """Entry point of the ``fedrec`` command."""
    _run_app()


if __name__ == "__main__":
    main()
