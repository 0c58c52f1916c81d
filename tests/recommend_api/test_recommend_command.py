"""``fedrec recommend``: labels and options that cannot be used stop the command with one line
before the server starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.recommend_api import __main__ as command
from services.recommend_api.ranking import read_labels_file

NO_AGGREGATOR = ["--aggregator-url", "none"]


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError("the server must not start")

    monkeypatch.setattr(command, "serve", refuse)
    monkeypatch.setenv("FEDREC_REC_ENVIRONMENT", "development")
    monkeypatch.setenv("FEDREC_REC_PORT", "0")  # any free port: the default may be in use


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--item-labels", "/nonexistent/labels.txt"], "FEDREC_REC_ITEM_LABELS: "),
        (["--item-labels", "/dev/zero"], "over 1000 characters"),
        (["--dataset", "nope"], "FEDREC_REC_DATASET: unknown dataset 'nope'"),
    ],
)
def test_labels_that_cannot_be_read_stop_the_command_in_one_line(
    args: list[str], message: str
) -> None:
    """They were a traceback from the server's start (and /dev/zero was read without end)."""
    with pytest.raises(SystemExit) as stop:
        command.main([*NO_AGGREGATOR, *args])
    assert message in str(stop.value.code), stop.value.code


def test_a_binary_labels_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(b"1\n\xff\xfe\n")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_labels_file(path)
    path.write_text("a\nb\n\n")
    assert read_labels_file(path) == ["a", "b"]


def test_an_unknown_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        command.main([*NO_AGGREGATOR, "--log-level", "nope"])
    assert stop.value.code == 2 and "a log level is one of" in capsys.readouterr().err


@pytest.mark.parametrize(
    "settings",
    ["services.aggregator.settings:Settings", "services.dashboard.settings:DashboardSettings"],
)
def test_the_other_services_refuse_an_unknown_log_level(settings: str) -> None:
    """uvicorn looked the level up at start: a KeyError traceback."""
    import importlib

    module, name = settings.split(":")
    cls = getattr(importlib.import_module(module), name)
    extra = {"operator_token": "op-token-0123456789abcdef"} if "aggregator" in module else {}
    with pytest.raises(ValidationError, match="a log level is one of"):
        cls(environment="development", log_level="nope", **extra)
    assert cls(environment="development", log_level="DEBUG", **extra).log_level == "DEBUG"


@pytest.mark.parametrize("setting", ["FEDREC_REC_WORKERS", "FEDREC_REC_TORCH_THREADS"])
def test_a_thread_count_beyond_any_machine_is_a_settings_error(
    setting: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--workers 100000 was taken (a scoring pool that grows to 100000 threads under load);
    so was the aggregator's and the worker's torch thread count, where torch then failed to map
    its libraries."""
    from services.aggregator.settings import Settings as AggregatorSettings

    with pytest.raises(SystemExit) as stop:
        monkeypatch.setenv(setting, "100000")
        command.main(NO_AGGREGATOR)
    assert stop.value.code not in (0, None)
    assert "must be at most 1024, got 100000" in capsys.readouterr().err + str(stop.value.code)
    token: dict[str, Any] = {
        "operator_token": "op-token-0123456789abcdef",
        "environment": "development",
    }
    with pytest.raises(ValidationError, match="less than or equal to 1024"):
        AggregatorSettings(torch_threads=100000, **token)
    assert AggregatorSettings(torch_threads=1024, **token).torch_threads == 1024
