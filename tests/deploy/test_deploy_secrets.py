"""Secrets of the compose deployment: generated once, taken from the environment when given,
placeholders refused, and read by the services through their ``*_FILE`` settings."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fedrecgel import presets
from fedrecgel.config import RunParams
from services.aggregator.settings import Settings as AggregatorSettings
from services.enrolment import enrolment_token
from services.recommend_api.settings import Settings as RecommendSettings
from tests.deploy.manifests import DEPLOY, deploy_script

init_secrets = deploy_script("init_secrets")
start_run = deploy_script("start_run")


def _read(d: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in sorted(d.iterdir())}


def test_first_start_generates_every_secret_and_a_restart_keeps_them(tmp_path: Path) -> None:
    report = init_secrets.ensure_secrets(tmp_path, {})
    first = _read(tmp_path)
    generated = set(init_secrets.SECRETS)
    assert generated == {
        "postgres_password",
        "operator_token",
        "reader_token",
        "enrolment_secret",
        "device_token",
    }
    assert set(first) == generated | {"enrolment_token_0", "enrolment_token_1"}
    assert sum(line.endswith("generated") for line in report) == len(generated)
    assert len(set(first.values())) == len(first) and all(len(v) >= 32 for v in first.values())
    # each shard's token is the one the aggregator derives from the secret
    for shard in (0, 1):
        assert first[f"enrolment_token_{shard}"] == enrolment_token(
            first["enrolment_secret"], shard, 2
        )
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    again = init_secrets.ensure_secrets(tmp_path, {})
    assert sorted(line for line in again if line.endswith("kept")) == sorted(
        f"{n}: kept" for n in generated
    )
    assert _read(tmp_path) == first
    # a second deployment gets other secrets
    other = tmp_path / "other"
    other.mkdir()
    init_secrets.ensure_secrets(other, {})
    assert set(_read(other).values()).isdisjoint(first.values())


def test_values_from_the_environment_replace_the_generated_ones(tmp_path: Path) -> None:
    init_secrets.ensure_secrets(tmp_path, {})
    before = _read(tmp_path)
    token = "a-real-operator-token-0123456789"
    report = init_secrets.ensure_secrets(tmp_path, {"FEDREC_AGG_OPERATOR_TOKEN": token})
    after = _read(tmp_path)
    assert after["operator_token"] == token
    assert after["reader_token"] == before["reader_token"]
    assert "operator_token: from FEDREC_AGG_OPERATOR_TOKEN" in report


@pytest.mark.parametrize(
    ("var", "value", "why"),
    [
        ("FEDREC_AGG_OPERATOR_TOKEN", "changethis", "placeholder"),
        ("FEDREC_AGG_READER_TOKEN", "REPLACE_ME", "placeholder"),
        ("FEDREC_AGG_READER_TOKEN", "short", "shorter than 16"),
        ("POSTGRES_PASSWORD", "p@ss:word/0123456789", "URL-safe"),
    ],
)
def test_placeholders_and_unusable_values_are_refused_and_nothing_is_written(
    tmp_path: Path, var: str, value: str, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        init_secrets.ensure_secrets(tmp_path, {var: value})
    assert list(tmp_path.iterdir()) == []


def test_the_script_exits_1_with_a_message_and_never_prints_a_secret(tmp_path: Path) -> None:
    env = {"SECRETS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    bad = subprocess.run(
        [sys.executable, str(DEPLOY / "init_secrets.py")],
        env={**env, "FEDREC_AGG_OPERATOR_TOKEN": "changethis"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "placeholder" in bad.stderr and "Traceback" not in bad.stderr
    ok = subprocess.run(
        [sys.executable, str(DEPLOY / "init_secrets.py")], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    for secret in _read(tmp_path).values():
        assert secret not in ok.stdout + ok.stderr


def test_aggregator_reads_its_secrets_from_files(tmp_path: Path) -> None:
    init_secrets.ensure_secrets(tmp_path, {})
    s = _read(tmp_path)
    settings = AggregatorSettings(
        environment="production",
        database_url="postgresql+psycopg://fedrec@postgres:5432/fedrec",
        operator_token_file=tmp_path / "operator_token",
        reader_token_file=tmp_path / "reader_token",
        database_password_file=tmp_path / "postgres_password",
    )
    assert settings.operator_token == s["operator_token"]
    assert settings.reader_token == s["reader_token"]
    assert settings.database_url == (
        f"postgresql+psycopg://fedrec:{s['postgres_password']}@postgres:5432/fedrec"
    )


def test_aggregator_secret_files_that_cannot_be_used_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="FEDREC_AGG_OPERATOR_TOKEN_FILE: cannot read"):
        AggregatorSettings(operator_token_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        AggregatorSettings(operator_token_file=tmp_path / "empty")
    (tmp_path / "t").write_text("a-real-token-0123456789\n")
    with pytest.raises(ValidationError, match="not both"):
        AggregatorSettings(operator_token="x" * 20, operator_token_file=tmp_path / "t")
    # the placeholder is refused in production whether it comes from a file or not
    (tmp_path / "placeholder").write_text("changethis\n")
    with pytest.raises(ValidationError, match="real secret"):
        AggregatorSettings(environment="production", operator_token_file=tmp_path / "placeholder")


def test_aggregator_secret_files_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t").write_text("env-file-token-0123456789\n")
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN_FILE", str(tmp_path / "t"))
    monkeypatch.delenv("FEDREC_AGG_OPERATOR_TOKEN", raising=False)
    assert AggregatorSettings(environment="production").operator_token == (
        "env-file-token-0123456789"
    )


def test_recommend_api_reads_its_token_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "reader").write_text("reader-token-0123456789\n")
    settings = RecommendSettings(aggregator_token_file=tmp_path / "reader", workers=1)
    assert settings.aggregator_token is not None
    assert settings.aggregator_token.get_secret_value() == "reader-token-0123456789"
    with pytest.raises(ValidationError, match="FEDREC_REC_AGGREGATOR_TOKEN_FILE"):
        RecommendSettings(aggregator_token_file=tmp_path / "missing", workers=1)


def test_demo_reads_the_operator_token_file_and_run_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "op").write_text("operator-token-0123456789\n")
    monkeypatch.delenv("FEDREC_AGG_OPERATOR_TOKEN", raising=False)
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN_FILE", str(tmp_path / "op"))
    assert start_run.operator_token() == "operator-token-0123456789"
    monkeypatch.setenv("RUN_CONFIG", '{"fraction": 0.1, "seed": 0}')
    monkeypatch.setenv("RUN_ROUNDS", "3")
    monkeypatch.setenv("RUN_DATASET", "filmtrust")
    monkeypatch.setenv("RUN_PRESET", "paper")
    cfg = start_run.run_config()
    assert cfg == {"fraction": 0.1, "seed": 0, "rounds": 3, "dataset": "filmtrust", "n_items": 2059}
    monkeypatch.delenv("RUN_PRESET")  # the default preset fills what RUN_CONFIG leaves out
    default = presets.run_settings("default", "filmtrust")
    assert default["rounds"] != 3 and default["server_lr"] != RunParams().server_lr
    assert start_run.run_config() == {**default, **cfg}
    monkeypatch.setenv("RUN_PRESET", "nonesuch")
    with pytest.raises(start_run.DemoError, match="RUN_PRESET: unknown preset 'nonesuch'"):
        start_run.run_config()
    monkeypatch.delenv("RUN_PRESET")
    monkeypatch.setenv("RUN_ROUNDS", "three")
    with pytest.raises(start_run.DemoError, match="RUN_ROUNDS"):
        start_run.run_config()
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(start_run.DemoError, match="cannot read"):
        start_run.operator_token()


def test_following_a_run_reads_the_history_a_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compose demo's follower pages the history: a run longer than one page completes,
    and a poll reads only the rounds after the newest one it holds."""
    from urllib.parse import parse_qs, urlsplit

    total, limit = 5, 2
    asked: list[str] = []

    def fake_request(
        url: str, token: Any = None, data: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        parts = urlsplit(url)
        if parts.path == "/v1/rounds/current":
            return 200, {"run_id": 1, "state": "open", "config": {"rounds": total}}
        if parts.path == "/v1/runs/current/history":
            assert len(asked) < 50, "the follower never saw the whole run"
            after = int(parse_qs(parts.query).get("after", ["0"])[0])
            asked.append(parts.query)
            ids = list(range(after + 1, total + 1))
            metrics = {"hr@10": 0.5, "ndcg@10": 0.3}
            rounds = [
                {"round_id": i, "n_updates": 2, "loss": 0.5, "seconds": 0.1, "metrics": metrics}
                for i in ids[:limit]
            ]
            more = len(ids) > limit
            body = {"run_id": 1, "planned_rounds": total, "rounds": rounds}
            return 200, {**body, "next_after": ids[limit - 1] if more else None}
        return 404, None

    monkeypatch.setattr(start_run, "_request", fake_request)
    monkeypatch.setattr(start_run, "say", lambda line: None)
    done = start_run.follow("http://aggregator", "token", poll_s=0.0)
    assert done["rounds"] == total
    assert [r["round_id"] for r in done["history"]["rounds"]] == [1, 2, 3, 4, 5]
    assert asked == ["after=0", "after=2", "after=4"]
