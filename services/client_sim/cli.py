"""Command line of the worker: flags override ``FEDREC_WORKER_*`` env values and defaults."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from services.client_sim.store import StoreError
from services.client_sim.worker import WorkerError, WorkerSettings, run_worker

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
    p.add_argument("--dataset", help="dataset name (default filmtrust)")
    p.add_argument("--data-dir", type=Path, help="data directory (default: $FEDREC_DATA_DIR)")
    p.add_argument(
        "--validation",
        action=argparse.BooleanOptionalAction,
        help="hold out a validation item per user (default off)",
    )
    p.add_argument("--store", help="store path or SQLAlchemy URL (default worker-0.db)")
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
    return p


def settings_from_args(argv: Sequence[str] | None = None) -> WorkerSettings:
    """Parse ``argv`` into settings (flags win over the environment)."""
    args: dict[str, Any] = vars(build_parser().parse_args(argv))
    return WorkerSettings(**args)


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
    try:
        run_worker(settings)
    except (WorkerError, StoreError) as err:
        log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130
    return 0
