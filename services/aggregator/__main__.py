"""``python -m services.aggregator``: serve the aggregator with settings from the environment."""

from __future__ import annotations

import argparse
import logging

import torch
import uvicorn
from pydantic import ValidationError

from services.aggregator.app import create_app
from services.aggregator.settings import Settings, resolve_population


def configure_process(settings: Settings) -> None:
    """Process-wide settings of a server process (torch threads)."""
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)


def main(argv: list[str] | None = None) -> None:
    """Parse optional --host/--port overrides and run uvicorn."""
    parser = argparse.ArgumentParser(
        prog="python -m services.aggregator",
        description="FedRecGEL aggregator (settings: FEDREC_AGG_* environment variables)",
    )
    parser.add_argument("--host", default=None, help="bind address (FEDREC_AGG_HOST)")
    parser.add_argument("--port", type=int, default=None, help="port (FEDREC_AGG_PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        raise SystemExit(f"invalid aggregator settings:\n{err}") from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    configure_process(settings)
    try:
        population = resolve_population(settings)
    except (OSError, ValueError) as err:  # a dataset that cannot be read (DataError too)
        raise SystemExit(
            f"FEDREC_AGG_POPULATION_DATASET={settings.population_dataset}: {err}"
        ) from None
    uvicorn.run(
        create_app(settings, population=population),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
    )


if __name__ == "__main__":
    main()
