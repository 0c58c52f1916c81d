"""``python -m services.aggregator``: serve the aggregator with settings from the environment."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from fedrecgel.allocator import keep_freed_memory
from fedrecgel.clitools import plain_app, run_app, settings_options
from services.aggregator.app import create_app
from services.aggregator.db import Database, ForeignDatabase
from services.aggregator.settings import Settings, resolve_population
from services.http_server import check_listen, header_timeout_s, serve

app = plain_app()


def configure_process(settings: Settings) -> None:
    """Process-wide settings of a server process: torch threads, and glibc's malloc keeping
    freed memory (:func:`fedrecgel.allocator.keep_freed_memory`): each close allocates and
    frees the same megabytes (the new version's and optimizer state's tensors, their encoded
    bytes), which otherwise come back as fresh pages, each first write a page fault."""
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    keep_freed_memory()


def _sqlite_hint(url: str) -> str:
    """Why an SQLite file cannot be opened when its directory is the cause, else ''."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return ""
    parent = Path(u.database).expanduser().absolute().parent
    if not parent.exists():
        return f" (the directory {parent} does not exist)"
    if not parent.is_dir():
        return f" ({parent} is not a directory)"
    return ""


def check_database(settings: Settings) -> None:
    """Open the database and bring its schema to the latest revision, as the app's start
    does, so that a database that cannot be used stops the command with one line (a
    ``SystemExit``) rather than a traceback from the server's start."""
    shown = make_url(settings.database_url).render_as_string(hide_password=True)
    db = Database(settings.database_url)
    try:
        db.migrate()
    except ForeignDatabase as err:
        raise SystemExit(f"FEDREC_AGG_DATABASE_URL: {err}") from None
    except SQLAlchemyError as err:
        cause = getattr(err, "orig", None) or err
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise SystemExit(
            f"FEDREC_AGG_DATABASE_URL={shown}: cannot use the database: "
            f"{reason}{_sqlite_hint(settings.database_url)}"
        ) from None
    finally:
        db.dispose()


@app.command()
@settings_options(Settings, {"host": "bind address", "port": "port"})
def aggregator(settings: Settings) -> None:
    """FedRecGEL aggregator (settings: FEDREC_AGG_* environment variables)."""
    check_listen(settings.host, settings.port, "--port (FEDREC_AGG_PORT)")
    # force: under ``fedrec aggregator`` the command line configured the root logger at
    # WARNING already, and the aggregator's own INFO lines (rounds closed) were lost
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    configure_process(settings)
    try:
        population = resolve_population(settings)
    except (OSError, ValueError) as err:  # a dataset that cannot be read (DataError too)
        raise SystemExit(
            f"FEDREC_AGG_POPULATION_DATASET={settings.population_dataset}: {err}"
        ) from None
    check_database(settings)
    header_timeout_s()  # a bound that is not a number stops here, in one line
    serve(
        create_app(settings, population=population, migrated=True),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
    )


def main(
    argv: Sequence[str] | None = None, prog_name: str = "python -m services.aggregator"
) -> None:
    """Run the aggregator with the options of ``argv`` over its settings."""
    if code := run_app(app, argv, prog_name):
        raise SystemExit(code)


if __name__ == "__main__":
    main()
