"""``python -m services.dashboard``: serve the federation's dashboard with uvicorn."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from pydantic import ValidationError

from services.dashboard.app import create_app
from services.dashboard.settings import DashboardSettings
from services.http_server import serve
from services.url_settings import describe_settings


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    """Command-line options; each overrides its ``FEDREC_DASH_*`` environment variable."""
    p = argparse.ArgumentParser(prog="python -m services.dashboard", description=__doc__)
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    p.add_argument("--aggregator-url", help="aggregator base URL")
    p.add_argument("--recommend-url", help="recommend_api base URL ('none': no such panel)")
    p.add_argument("--worker-urls", help="the workers' device APIs, comma-separated, shard order")
    p.add_argument(
        "--poll-interval",
        dest="poll_interval_s",
        type=float,
        help="seconds between the page's state reads",
    )
    p.add_argument("--log-level", help="logging level")
    describe_settings(p, DashboardSettings)
    args = vars(p.parse_args(argv))
    return {k: v for k, v in args.items() if v is not None}


def main(argv: list[str] | None = None) -> None:
    """Parse options, build the app and run it."""
    opts = parse_args(argv)
    if str(opts.get("recommend_url", "")).lower() == "none":
        opts["recommend_url"] = None
    try:
        settings = DashboardSettings(**opts)
    except ValidationError as err:
        raise SystemExit(f"invalid dashboard settings:\n{err}") from None
    level = settings.log_level.lower()
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    serve(create_app(settings), host=settings.host, port=settings.port, log_level=level)


if __name__ == "__main__":
    main()
