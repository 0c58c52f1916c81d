"""``python -m services.recommend_api``: serve recommendations with uvicorn."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated

import torch
import typer

from fedrecgel.clitools import plain_app, run_app, settings_options
from fedrecgel.data import DataError
from services.http_server import check_listen, header_timeout_s, serve
from services.recommend_api.app import create_app, holder_from_settings
from services.recommend_api.settings import Settings
from services.url_settings import check_log_level

app = plain_app()

#: the options of the settings: each overrides its ``FEDREC_REC_*`` environment variable
OPTIONS = {
    "host": "bind address",
    "port": "port",
    "aggregator_url": "aggregator base URL ('none': do not follow one)",
    "aggregator_token": "the aggregator's reader token",
    "redis_url": "follow model versions by Redis events too",
    "poll_interval_s": "seconds between model polls",
    "dataset": "dataset whose item ids label the catalogue",
    "data_dir": "folder of the raw datasets",
    "item_labels": "file of item ids, one per line",
    "ann_threshold": "catalogue size from which candidates are shortlisted",
    "ann_shortlist": "candidates re-ranked exactly",
    "workers": "scoring threads (unset: one per core)",
}


def _log_level(value: str) -> str:
    try:
        return check_log_level(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


@app.command()
@settings_options(Settings, OPTIONS, {"poll_interval_s": ("--poll-interval",)})
def recommend(
    settings: Settings,
    log_level: Annotated[str, typer.Option(callback=_log_level, help="logging level")] = "info",
) -> None:
    """Serve recommendations with uvicorn; each option overrides its FEDREC_REC_* variable."""
    check_listen(settings.host, settings.port, "--port (FEDREC_REC_PORT)")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # process-wide, so set here and not in create_app (tests build apps in a shared process)
    torch.set_num_threads(settings.torch_threads)
    try:  # the item labels: a file or dataset that cannot be read stops here, in one line
        holder = holder_from_settings(settings)
    except (OSError, ValueError, DataError) as err:
        what = "FEDREC_REC_ITEM_LABELS" if settings.item_labels else "FEDREC_REC_DATASET"
        raise SystemExit(f"{what}: {err}") from None
    header_timeout_s()  # a bound that is not a number stops here, in one line
    api = create_app(settings, holder=holder)
    serve(api, host=settings.host, port=settings.port, log_level=log_level)


def main(
    argv: Sequence[str] | None = None, prog_name: str = "python -m services.recommend_api"
) -> None:
    """Run the recommendation API with the options of ``argv`` over its settings."""
    if code := run_app(app, argv, prog_name):
        raise SystemExit(code)


if __name__ == "__main__":
    main()
