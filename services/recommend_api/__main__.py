"""``python -m services.recommend_api``: serve recommendations with uvicorn."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from fedrecgel.data import DataError
from services.http_server import header_timeout_s, serve
from services.recommend_api.app import create_app, holder_from_settings
from services.recommend_api.settings import Settings
from services.url_settings import check_log_level, describe_settings


def _log_level(value: str) -> str:
    try:
        return check_log_level(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line options; each overrides its ``FEDREC_REC_*`` environment variable."""
    p = argparse.ArgumentParser(prog="python -m services.recommend_api", description=__doc__)
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    p.add_argument("--aggregator-url", help="aggregator base URL ('none': do not follow one)")
    p.add_argument("--aggregator-token", help="the aggregator's reader token")
    p.add_argument("--redis-url", help="follow model versions by Redis events too")
    p.add_argument(
        "--poll-interval", dest="poll_interval_s", type=float, help="seconds between model polls"
    )
    p.add_argument("--dataset", help="dataset whose item ids label the catalogue")
    p.add_argument("--data-dir", type=Path)
    p.add_argument("--item-labels", type=Path, help="file of item ids, one per line")
    p.add_argument(
        "--ann-threshold", type=int, help="catalogue size from which candidates are shortlisted"
    )
    p.add_argument("--ann-shortlist", type=int, help="candidates re-ranked exactly")
    p.add_argument("--workers", type=int, help="scoring threads (unset: one per core)")
    p.add_argument("--log-level", default="info", type=_log_level, help="(default info)")
    describe_settings(p, Settings)
    args = vars(p.parse_args(argv))
    return {k: v for k, v in args.items() if v is not None}


def main(argv: list[str] | None = None) -> None:
    """Parse options, build the app and run it."""
    opts = parse_args(argv)
    level = opts.pop("log_level")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if str(opts.get("aggregator_url", "")).lower() == "none":
        opts["aggregator_url"] = None
    try:
        settings = Settings(**opts)
    except ValidationError as err:
        raise SystemExit(f"invalid recommend_api settings:\n{err}") from None
    # process-wide, so set here and not in create_app (tests build apps in a shared process)
    torch.set_num_threads(settings.torch_threads)
    try:  # the item labels: a file or dataset that cannot be read stops here, in one line
        holder = holder_from_settings(settings)
    except (OSError, ValueError, DataError) as err:
        what = "FEDREC_REC_ITEM_LABELS" if settings.item_labels else "FEDREC_REC_DATASET"
        raise SystemExit(f"{what}: {err}") from None
    header_timeout_s()  # a bound that is not a number stops here, in one line
    app = create_app(settings, holder=holder)
    serve(app, host=settings.host, port=settings.port, log_level=level)


if __name__ == "__main__":
    main()
