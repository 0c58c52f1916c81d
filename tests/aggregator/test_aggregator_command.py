"""``fedrec aggregator`` (``python -m services.aggregator``): settings and a database that
cannot be used stop it with one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import services.aggregator.__main__ as command
from harness.procs import FEDREC_MODULE, spawned, wait_for_text
from services.aggregator.db import Database
from tests.support.loopback import free_port


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The apps the command would serve (the server itself is not started)."""
    served: list[Any] = []
    monkeypatch.setattr(command, "serve", lambda app, **_: served.append(app))
    monkeypatch.setenv("FEDREC_AGG_ENVIRONMENT", "development")
    monkeypatch.setenv("FEDREC_AGG_PORT", "0")  # any free port: the default may be in use
    return served


def _refusal(monkeypatch: pytest.MonkeyPatch, url: str) -> str:
    monkeypatch.setenv("FEDREC_AGG_DATABASE_URL", url)
    with pytest.raises(SystemExit) as stopped:
        command.main([])
    message = str(stopped.value.code)
    assert message.startswith("FEDREC_AGG_DATABASE_URL=") and "\n" not in message
    return message


def test_sqlite_file_under_a_missing_directory_is_one_line(
    monkeypatch: pytest.MonkeyPatch, started: list[Any], tmp_path: Path
) -> None:
    message = _refusal(monkeypatch, f"sqlite:///{tmp_path}/missing/dir/a.db")
    assert f"the directory {tmp_path}/missing/dir does not exist" in message
    assert started == []


def test_sqlite_file_under_a_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, started: list[Any], tmp_path: Path
) -> None:
    (tmp_path / "afile").write_text("")
    message = _refusal(monkeypatch, f"sqlite:///{tmp_path}/afile/a.db")
    assert f"{tmp_path}/afile is not a directory" in message
    assert started == []


def test_unreachable_postgres_is_one_line_without_the_password(
    monkeypatch: pytest.MonkeyPatch, started: list[Any]
) -> None:
    port = free_port()  # nothing listens there
    message = _refusal(monkeypatch, f"postgresql+psycopg://u:hunter2@127.0.0.1:{port}/db")
    assert "cannot use the database" in message and "hunter2" not in message
    assert started == []


def test_a_usable_database_is_migrated_and_served(
    monkeypatch: pytest.MonkeyPatch, started: list[Any], tmp_path: Path
) -> None:
    monkeypatch.setenv("FEDREC_AGG_DATABASE_URL", f"sqlite:///{tmp_path}/a.db")
    migrations: list[Database] = []
    migrate = Database.migrate

    def counted(db: Database) -> None:
        migrations.append(db)
        migrate(db)

    monkeypatch.setattr(Database, "migrate", counted)
    command.main([])
    assert len(started) == 1 and (tmp_path / "a.db").exists()
    with TestClient(started[0]) as client:  # the served app's start: no second migration
        assert client.get("/healthz").status_code == 200
    assert len(migrations) == 1


def test_fedrec_aggregator_logs_its_own_lines_at_its_log_level(tmp_path: Path) -> None:
    """``fedrec aggregator`` (not ``python -m services.aggregator``) logged none of the
    aggregator's own INFO lines (ready, rounds closed) whatever ``FEDREC_AGG_LOG_LEVEL``
    said: the command line had configured the root logger at WARNING before it started."""
    env = {
        **os.environ,
        "FEDREC_AGG_ENVIRONMENT": "development",
        "FEDREC_AGG_DATABASE_URL": f"sqlite:///{tmp_path}/a.db",
        "FEDREC_AGG_LOG_LEVEL": "info",
    }
    log_path = tmp_path / "aggregator.log"
    args = [sys.executable, "-m", FEDREC_MODULE, "aggregator", "--port", str(free_port())]
    with log_path.open("ab") as log, spawned(args, log, grace_s=10, env=env) as proc:
        text = wait_for_text(log_path, "Application startup complete", proc, timeout_s=120)
    assert "INFO services.aggregator.app: aggregator ready" in text, text
