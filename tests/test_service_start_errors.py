"""The services' start-up refusals (issue: a newcomer's audit): settings that cannot be used
are one line each, naming the option and its variable, never pydantic's report (``1
validation error for Settings``, its link); every weak secret of the aggregator is named at
once, an unset operator token as not set; a port something else listens on stops a service
before it starts (uvicorn said "Application startup complete" first)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.aggregator import __main__ as aggregator_command
from services.client_sim import cli as worker_command
from services.dashboard import __main__ as dashboard_command
from services.recommend_api import __main__ as recommend_command

STRONG = "Zq3vN8rT2mK7pW4xY9bC"
PREFIXES = ("FEDREC_AGG_", "FEDREC_REC_", "FEDREC_DASH_", "FEDREC_WORKER_")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(PREFIXES):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError("the service must not start")

    for command in (aggregator_command, recommend_command, dashboard_command):
        monkeypatch.setattr(command, "serve", refuse)
    monkeypatch.setattr(worker_command, "run_worker", refuse)


def _status(main: Callable[[list[str]], Any], argv: list[str]) -> int:
    """The exit status of a service's ``main`` (the worker's returns it, the others raise)."""
    try:
        return int(main(argv) or 0)
    except SystemExit as stop:
        assert not isinstance(stop.code, str), stop.code
        return int(stop.code or 0)


#: each service's main, its port option and variable, and its exit status for bad settings
SERVICES = [
    pytest.param(aggregator_command.main, "--port", "FEDREC_AGG_PORT", 1, id="aggregator"),
    pytest.param(recommend_command.main, "--port", "FEDREC_REC_PORT", 1, id="recommend"),
    pytest.param(dashboard_command.main, "--port", "FEDREC_DASH_PORT", 1, id="dashboard"),
    pytest.param(worker_command.main, "--http-port", "FEDREC_WORKER_HTTP_PORT", 2, id="worker"),
]


@pytest.mark.parametrize(("main", "flag", "variable", "code"), SERVICES)
def test_a_bad_setting_is_one_line_naming_its_option_and_variable(
    main: Callable[[list[str]], Any],
    flag: str,
    variable: str,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN", STRONG)
    assert _status(main, [flag, "99999"]) == code
    err = capsys.readouterr().err
    assert err == f"error: {flag} ({variable}): must be at most 65535, got 99999\n", err
    monkeypatch.setenv(variable, "abc")  # from the environment: the same words
    assert _status(main, []) == code
    err = capsys.readouterr().err
    assert err == f"error: {flag} ({variable}): must be an integer, got abc\n", err


def test_every_bad_setting_is_named_and_a_setting_without_option_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDREC_REC_ANN_INDEX", "nope")
    monkeypatch.setenv("FEDREC_REC_FETCH_TIMEOUT_S", "1e9")
    argv = ["--port", "-1", "--aggregator-url", "ftp://agg", "--poll-interval", "0"]
    assert _status(recommend_command.main, argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: --port (FEDREC_REC_PORT): must be at least 0, got -1",
        "error: --aggregator-url (FEDREC_REC_AGGREGATOR_URL): an HTTP URL starts with http:// "
        "or https://",
        "error: --poll-interval (FEDREC_REC_POLL_INTERVAL_S): must be more than 0, got 0",
        "error: FEDREC_REC_FETCH_TIMEOUT_S: must be at most 86400, got 1e9",
        "error: FEDREC_REC_ANN_INDEX: must be one of 'auto', 'flat', 'ivf' or 'scan'",
    ]


def test_a_rule_across_settings_is_its_own_words_without_pydantics_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDREC_WORKER_ENROLMENT_TOKEN", "wrongtoken")
    assert _status(worker_command.main, ["--shard", "0", "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: FEDREC_WORKER_ENROLMENT_TOKEN: not an enrolment token (expected "
        "enrol-v1.<shard>.<shards>.<64 hex digits>)\n"
    ), err


def test_every_weak_secret_of_the_aggregator_is_named_and_an_unset_token_as_unset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDREC_AGG_READER_TOKEN", "short")
    monkeypatch.setenv("FEDREC_AGG_ENROLMENT_SECRET", "changeme")
    assert _status(aggregator_command.main, []) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines
    assert lines[0].startswith("error: FEDREC_AGG_OPERATOR_TOKEN is not set"), lines
    assert lines[1].startswith("error: FEDREC_AGG_READER_TOKEN is shorter than 16"), lines
    assert lines[2].startswith("error: FEDREC_AGG_ENROLMENT_SECRET is a placeholder"), lines
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN", "changethis")  # set, to a placeholder
    assert _status(aggregator_command.main, []) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: FEDREC_AGG_OPERATOR_TOKEN is a placeholder"), lines


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port of 127.0.0.1 something listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(("main", "flag", "variable", "code"), SERVICES)
def test_a_port_in_use_stops_the_service_before_it_starts(
    main: Callable[[list[str]], Any],
    flag: str,
    variable: str,
    code: int,
    busy_port: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for prefix in ("FEDREC_AGG_", "FEDREC_REC_", "FEDREC_DASH_"):
        monkeypatch.setenv(f"{prefix}ENVIRONMENT", "development")
    database = tmp_path / "aggregator.db"
    monkeypatch.setenv("FEDREC_AGG_DATABASE_URL", f"sqlite:///{database}")
    argv = [flag, str(busy_port)]
    if main is worker_command.main:
        argv += ["--store", str(tmp_path / "w.db")]
    if main is recommend_command.main:
        argv += ["--aggregator-url", "none"]
    # uvicorn's own status when its bind failed; the worker's when its HTTP API did not start
    assert _status(main, argv) == (1 if main is worker_command.main else 3)
    assert capsys.readouterr().err == (
        f"error: {flag} ({variable}): cannot listen on 127.0.0.1:{busy_port}: address already "
        "in use (stop what uses it, or choose another port)\n"
    )
    assert not database.exists() and not (tmp_path / "w.db").exists()  # nothing was started
