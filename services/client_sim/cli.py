"""Command line of the worker: flags override ``FEDREC_WORKER_*`` env values and defaults."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import StoreError
from services.client_sim.worker import run_worker

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The worker's argument parser (every flag defaults to the env / settings value)."""
    p = argparse.ArgumentParser(
        prog="fedrec worker",
        description="Simulate the clients of one shard of users against an aggregator.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--aggregator", help="aggregator base URL (default http://127.0.0.1:8700)")
    p.add_argument("--shard", type=int, help="this worker's shard index I (owns u %% N == I)")
    p.add_argument("--shards", type=int, help="number of shards N")
    p.add_argument(
        "--enrolment-token-file",
        type=Path,
        help="file holding the shard's enrolment token ({shard} is replaced by the shard; "
        "or $FEDREC_WORKER_ENROLMENT_TOKEN)",
    )
    p.add_argument("--dataset", help="dataset name (default filmtrust)")
    p.add_argument("--data-dir", type=Path, help="data directory (default: $FEDREC_DATA_DIR)")
    p.add_argument(
        "--validation",
        action=argparse.BooleanOptionalAction,
        help="hold out a validation item per user (default off)",
    )
    p.add_argument(
        "--store",
        help="store path or SQLAlchemy URL; {shard} is replaced by the shard (default worker-0.db)",
    )
    p.add_argument("--redis-url", help="subscribe to version events on this Redis")
    p.add_argument("--max-rounds", type=int, help="stop after this many model versions")
    p.add_argument(
        "--exit-when-finished",
        action=argparse.BooleanOptionalAction,
        help="stop when the run finishes (default on)",
    )
    p.add_argument("--poll-min-s", type=float, help="first poll interval when idle")
    p.add_argument("--poll-max-s", type=float, help="longest poll interval when idle")
    p.add_argument("--timeout-s", type=float, help="HTTP timeout")
    p.add_argument("--retries", type=int, help="retries of a failed request")
    p.add_argument("--max-body-bytes", type=int, help="byte budget of one upload body")
    p.add_argument("--log-level", help="logging level (default INFO)")
    p.add_argument("--torch-threads", type=int, help="torch intra-op threads (default: cores)")
    p.add_argument(
        "--shard-from-hostname",
        action=argparse.BooleanOptionalAction,
        help="take --shard from the host name's trailing ordinal (StatefulSet pod worker-I)",
    )
    p.add_argument("--http-port", type=int, help="serve the demo HTTP API on this port")
    p.add_argument(
        "--http-host",
        help="bind address of the HTTP API (default 127.0.0.1; another needs a device token)",
    )
    p.add_argument(
        "--device-token-file",
        type=Path,
        help="file holding the token the HTTP API requires (or $FEDREC_WORKER_DEVICE_TOKEN)",
    )
    p.add_argument("--recommend-url", help="recommend_api base URL (default http://127.0.0.1:8702)")
    p.add_argument(
        "--recommend-item-ids",
        choices=("dataset", "index"),
        help="item ids recommend_api uses: the dataset's (default) or catalogue indices",
    )
    return p


def settings_from_args(argv: Sequence[str] | None = None) -> WorkerSettings:
    """Parse ``argv`` into settings (flags win over the environment)."""
    args: dict[str, Any] = vars(build_parser().parse_args(argv))
    return WorkerSettings(**args)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM -> KeyboardInterrupt: stop like Ctrl-C (uncommitted state rolls back)."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, configure logging, run the worker; returns the exit status."""
    try:
        settings = settings_from_args(argv)
    except ValidationError as err:
        sys.stderr.write(f"invalid worker settings:\n{err}\n")
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll is noise
    if settings.torch_threads is not None:  # process-wide, so only in the process entry
        torch.set_num_threads(settings.torch_threads)
    # As PID 1 of a container, a process without a SIGTERM handler ignores `docker stop` and
    # the orchestrator's SIGTERM until it is killed; stop on it as on Ctrl-C instead.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_worker(settings)
    except (WorkerError, StoreError) as err:
        log.error("%s", err)
        return 1
    except AggregatorCallError as err:  # a refusal no retry can fix (e.g. an unknown token)
        log.error("the aggregator refused a request: %s", err)
        return 1
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
