"""``fedrec enrolment-token``: the token of a worker shard, from the aggregator's secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from services.cli import app
from services.enrolment import verify_enrolment_token

SECRET = "deployment-enrolment-secret-0123456789"


def _run(*args: str, env: dict[str, str] | None = None) -> Result:
    base = {"FEDREC_AGG_ENROLMENT_SECRET": "", "FEDREC_AGG_ENROLMENT_SECRET_FILE": ""}
    return CliRunner().invoke(app, ["enrolment-token", *args], env={**base, **(env or {})})


def test_prints_the_token_the_aggregator_verifies_from_env_or_file(tmp_path: Path) -> None:
    r = _run("--shard", "1", "--shards", "3", env={"FEDREC_AGG_ENROLMENT_SECRET": SECRET})
    assert r.exit_code == 0, r.output
    token = r.output.strip()
    shard = verify_enrolment_token(SECRET, token)
    assert shard is not None and (shard.shard, shard.shards) == (1, 3)
    (tmp_path / "secret").write_text(SECRET + "\n")
    env = {"FEDREC_AGG_ENROLMENT_SECRET_FILE": str(tmp_path / "secret")}
    assert _run("--shard", "1", "--shards", "3", env=env).output.strip() == token
    flag = _run("--shard", "1", "--shards", "3", "--secret-file", str(tmp_path / "secret"))
    assert flag.output.strip() == token
    assert verify_enrolment_token("another-secret-0123456789", token) is None


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--shard", "0", "--shards", "2"], {}, "no enrolment secret"),
        (["--shard", "2", "--shards", "2"], {"FEDREC_AGG_ENROLMENT_SECRET": SECRET}, "shard"),
        (
            ["--shard", "0", "--shards", "2"],
            {"FEDREC_AGG_ENROLMENT_SECRET_FILE": "/nonexistent/secret"},
            "cannot read",
        ),
    ],
)
def test_unusable_input_is_a_message_and_exit_status_2(
    args: list[str], env: dict[str, str], message: str
) -> None:
    r = _run(*args, env=env)
    assert r.exit_code == 2 and message in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("name", ["/dev/zero", "big"])
def test_a_huge_or_endless_secret_file_is_refused_without_reading_it_whole(
    tmp_path: Path, name: str
) -> None:
    path = name if name.startswith("/") else str(tmp_path / name)
    if not name.startswith("/"):
        (tmp_path / name).write_bytes(b"x" * (1 << 20))
    r = _run("--shard", "0", "--shards", "1", "--secret-file", path)
    assert r.exit_code == 2 and "larger than" in r.output, r.output


@pytest.mark.parametrize("secret", ["short", "changethis-0123456789", "abababababababababab"])
def test_a_secret_the_aggregator_refuses_issues_no_token(secret: str, tmp_path: Path) -> None:
    """A short secret printed a token, but the aggregator refused to start with it: one rule
    now (services.aggregator.settings.refused_secret), in its environment (production unless
    FEDREC_AGG_ENVIRONMENT says otherwise)."""
    from pydantic import ValidationError

    from services.aggregator.settings import Settings

    env = {"FEDREC_AGG_ENROLMENT_SECRET": secret, "FEDREC_AGG_ENVIRONMENT": ""}
    r = _run("--shard", "0", "--shards", "2", env=env)
    assert r.exit_code == 2 and "FEDREC_AGG_ENROLMENT_SECRET" in r.output, r.output
    assert "aggregator would refuse" in r.output and "Traceback" not in r.output
    with pytest.raises(ValidationError, match="FEDREC_AGG_ENROLMENT_SECRET"):
        Settings(environment="production", operator_token=SECRET, enrolment_secret=secret)
    (tmp_path / "secret").write_text(secret + "\n")
    r = _run("--shard", "0", "--shards", "2", "--secret-file", str(tmp_path / "secret"))
    assert r.exit_code == 2 and "--secret-file" in r.output, r.output
    # development, chosen explicitly, accepts it in both
    r = _run("--shard", "0", "--shards", "2", env={**env, "FEDREC_AGG_ENVIRONMENT": "development"})
    assert r.exit_code == 0 and verify_enrolment_token(secret, r.output.strip()) is not None
    Settings(environment="development", enrolment_secret=secret)


def test_an_unknown_aggregator_environment_is_refused() -> None:
    env = {"FEDREC_AGG_ENROLMENT_SECRET": SECRET, "FEDREC_AGG_ENVIRONMENT": "prod"}
    r = _run("--shard", "0", "--shards", "2", env=env)
    assert r.exit_code == 2 and "FEDREC_AGG_ENVIRONMENT must be one of" in r.output, r.output
