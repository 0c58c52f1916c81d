"""Command line of the worker: flags override ``FEDREC_WORKER_*`` env values and defaults."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence

import torch
import typer

from fedrecgel import native
from fedrecgel.clitools import plain_app, run_app, settings_options
from fedrecgel.data import DataError
from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.loop import run_worker
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import StoreError
from services.http_server import check_listen

log = logging.getLogger(__name__)


#: the help of every option: ``--a-name`` sets the WorkerSettings field ``a_name`` and takes
#: its type (an on/off switch for a bool); the help adds its variable and default
#: (:func:`fedrecgel.clitools.settings_options`)
HELP: dict[str, str] = {
    "aggregator": "aggregator base URL",
    "shard": "this worker's shard index I (owns u % N == I)",
    "shards": "number of shards N",
    "enrolment_token_file": "file holding the shard's enrolment token ({shard} is replaced by "
    "the shard; or $FEDREC_WORKER_ENROLMENT_TOKEN)",
    "dataset": "dataset name",
    "data_dir": "data directory (else $FEDREC_DATA_DIR)",
    "validation": "hold out a validation item per user",
    "store": "store path or SQLAlchemy URL; {shard} is replaced by the shard",
    "redis_url": "subscribe to version events on this Redis",
    "max_rounds": "stop after this many model versions",
    "exit_when_finished": "stop when the run finishes",
    "poll_min_s": "first poll interval when idle",
    "poll_max_s": "longest poll interval when idle",
    "timeout_s": "HTTP timeout",
    "retries": "retries of a failed request",
    "retry_deadline_s": "seconds after a request's first try past which it is not tried again",
    "max_body_bytes": "byte budget of one upload body",
    "log_level": "logging level",
    "torch_threads": "torch intra-op threads (unset: one per core)",
    "grouped_uploads": "compute the cohort members' uploads in groups: faster, but bit for bit "
    "only while no worker recomputes part of a round after a crash",
    "shard_from_hostname": "take --shard from the host name's trailing ordinal (StatefulSet "
    "pod worker-I)",
    "http_port": "serve the demo HTTP API on this port",
    "http_host": "bind address of the HTTP API (one off loopback needs a device token)",
    "device_token_file": "file holding the token the HTTP API requires (or "
    "$FEDREC_WORKER_DEVICE_TOKEN)",
    "recommend_url": "recommend_api base URL",
    "recommend_item_ids": "item ids recommend_api uses: the dataset's or catalogue indices",
}


app = plain_app()


def settings_from_args(argv: Sequence[str] | None = None) -> WorkerSettings:
    """Parse ``argv`` into settings (flags win over the environment)."""
    ctx = typer.main.get_command(app).make_context("fedrec worker", list(argv or []))
    return WorkerSettings(**{k: v for k, v in ctx.params.items() if v is not None})


#: the signals that stop the worker
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (or Ctrl-C) -> KeyboardInterrupt: stop (uncommitted state rolls back). Once: a
    further signal while the worker stops is ignored, as its KeyboardInterrupt raised inside
    the clean-up (SQLAlchemy closing the store's connections) printed a traceback."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


@app.command()
@settings_options(WorkerSettings, HELP, code=2)
def worker(settings: WorkerSettings) -> None:
    """Simulate the clients of one shard of users against an aggregator."""
    problem = native.check()  # FEDREC_NATIVE: a bad value or a required build that failed
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll is noise
    if settings.torch_threads is not None:  # process-wide, so only in the process entry
        torch.set_num_threads(settings.torch_threads)
    if settings.http_port is not None:  # before the data is loaded (WorkerError: too late)
        check_listen(
            settings.http_host, settings.http_port, "--http-port (FEDREC_WORKER_HTTP_PORT)", 1
        )
    # As PID 1 of a container, a process without a SIGTERM handler ignores `docker stop` and
    # the orchestrator's SIGTERM until it is killed; stop on it as on Ctrl-C instead.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {stop: signal.signal(stop, _interrupt) for stop in STOP_SIGNALS}
    try:
        run_worker(settings)
    except (WorkerError, StoreError, DataError) as err:  # DataError: an unknown dataset
        log.error("%s", err)
        raise typer.Exit(1) from None
    except AggregatorCallError as err:  # a refusal no retry can fix (e.g. an unknown token)
        # or no answer after every retry: its message says so ("aggregator unreachable")
        log.error("%s", err if err.status_code == 0 else f"the aggregator refused a request: {err}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        log.info("interrupted")
        raise typer.Exit(130) from None
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, configure logging, run the worker; returns the exit status."""
    return run_app(app, argv, "fedrec worker")
