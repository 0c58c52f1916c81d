"""Secrets of the aggregator (issue 8, finding 10): production is the default environment,
and there no token or secret may be a placeholder, short or of low entropy; development must
be chosen explicitly to run with weak ones."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from services.aggregator.settings import Settings

STRONG = "Zq3vN8rT2mK7pW4xY9bC"
FIELDS = ("operator_token", "reader_token", "enrolment_secret")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("FEDREC_AGG_"):
            monkeypatch.delenv(key)


def test_production_is_the_default_environment() -> None:
    """Regression: the default was development, where ``changethis`` was accepted."""
    assert Settings(operator_token=STRONG).environment == "production"
    with pytest.raises(ValidationError, match="FEDREC_AGG_OPERATOR_TOKEN is not set"):
        Settings()  # the placeholder operator token, left unset: told as not set


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    "value",
    [
        "changethis",
        "REPLACE_ME",
        "changeme",
        "ChangeMe",
        "changethis-changethis-changethis",
        "short-Secret1",  # < 16 characters
        "aaaaaaaaaaaaaaaaaaaaaaaa",  # low entropy
        "abababababababababababab",
    ],
)
def test_weak_secrets_are_refused_in_production(field: str, value: str) -> None:
    """Regression: a reader token of REPLACE_ME was accepted in production."""
    values: dict[str, Any] = {"operator_token": STRONG, field: value}
    with pytest.raises(ValidationError, match=f"FEDREC_AGG_{field.upper()}"):
        Settings(environment="production", **values)


def test_development_must_be_chosen_to_accept_weak_secrets() -> None:
    s = Settings(environment="development", reader_token="REPLACE_ME", enrolment_secret="x")
    assert s.operator_token == "changethis" and s.reader_token == "REPLACE_ME"


def test_strong_secrets_are_accepted_in_production() -> None:
    s = Settings(
        operator_token=STRONG,
        reader_token="r" + STRONG,
        enrolment_secret="e" + STRONG,
        population=10,
    )
    assert (s.environment, s.population) == ("production", 10)


def test_population_and_its_dataset_are_exclusive() -> None:
    with pytest.raises(ValidationError, match="not both"):
        Settings(operator_token=STRONG, population=10, population_dataset="filmtrust")


def test_the_server_refuses_to_start_with_a_weak_secret_without_a_traceback() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FEDREC_AGG_")},
        "FEDREC_AGG_OPERATOR_TOKEN": STRONG,
        "FEDREC_AGG_READER_TOKEN": "REPLACE_ME",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "services.aggregator"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "FEDREC_AGG_READER_TOKEN is a placeholder" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"database_url": "postgresql+psycopg//u:hunter2@db/fedrec"}, "not a database URL"),
        ({"database_url": "nonsense://u:hunter2@db/fedrec"}, "no database driver for 'nonsense'"),
        ({"database_url": "mysql://u:hunter2@db/fedrec"}, "no database driver for 'mysql'"),
        ({"redis_url": "localhost:6379"}, "a Redis URL starts with redis://"),
        ({"redis_url": "redis://:hunter2@cache:notaport"}, "not a Redis URL: Port could not"),
    ],
)
def test_a_mistyped_url_is_a_settings_error_that_shows_no_secret(
    settings: dict[str, str], message: str
) -> None:
    # refused before start (it was a traceback from the client library at the first
    # connection), and the error never echoes the value: a URL may hold a password
    with pytest.raises(ValidationError, match=message) as err:
        Settings(operator_token=STRONG, enrolment_secret="e" + STRONG, **settings)  # type: ignore[arg-type]
    assert "hunter2" not in str(err.value) and STRONG not in str(err.value)
    assert "e" + STRONG[-6:] not in str(err.value)


def test_a_settings_error_does_not_show_the_end_of_another_secret() -> None:
    with pytest.raises(ValidationError, match="placeholder") as err:
        Settings(operator_token="changethis", enrolment_secret="enrolment-" + STRONG)
    assert STRONG[-6:] not in str(err.value)
