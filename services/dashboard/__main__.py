"""``python -m services.dashboard``: serve the federation's dashboard with uvicorn."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fedrecgel.clitools import plain_app, run_app, settings_options
from services.dashboard.app import create_app
from services.dashboard.settings import DashboardSettings
from services.http_server import check_listen, serve

app = plain_app()

#: the options of the settings: each overrides its ``FEDREC_DASH_*`` environment variable
OPTIONS = {
    "host": "bind address",
    "port": "port",
    "aggregator_url": "aggregator base URL",
    "recommend_url": "recommend_api base URL ('none': no such panel)",
    "worker_urls": "the workers' device APIs, comma-separated, shard order",
    "poll_interval_s": "seconds between the page's state reads",
    "log_level": "logging level",
}


@app.command()
@settings_options(DashboardSettings, OPTIONS, {"poll_interval_s": ("--poll-interval",)})
def dashboard(settings: DashboardSettings) -> None:
    """Serve the federation's dashboard; each option overrides its FEDREC_DASH_* variable."""
    check_listen(settings.host, settings.port, "--port (FEDREC_DASH_PORT)")
    level = settings.log_level.lower()
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    serve(create_app(settings), host=settings.host, port=settings.port, log_level=level)


def main(
    argv: Sequence[str] | None = None, prog_name: str = "python -m services.dashboard"
) -> None:
    """Run the dashboard with the options of ``argv`` over its settings."""
    if code := run_app(app, argv, prog_name):
        raise SystemExit(code)


if __name__ == "__main__":
    main()
