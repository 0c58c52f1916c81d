"""The worker's demo HTTP API listens on loopback unless told, and then only with a device
token, which every request but /healthz must carry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from fedrecgel.data import Split
from services.client_sim.cli import settings_from_args
from services.client_sim.settings import WorkerSettings
from tests.client_sim.device_api import (
    DEVICE_TOKEN,
    WITH_TOKEN,
    WRONG_TOKEN,
    behind_token,
    device_split,
)


@pytest.fixture(scope="module")
def split() -> Split:
    return device_split()


def test_the_device_api_listens_on_loopback_unless_told_and_then_needs_a_token(
    tmp_path: Path,
) -> None:
    assert WorkerSettings(http_port=8710).http_host == "127.0.0.1"
    assert WorkerSettings(http_port=8710, http_host="::1").device_token is None
    for host in ("0.0.0.0", "10.1.2.3", "worker-0"):
        with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
            WorkerSettings(http_port=8710, http_host=host)
    s = WorkerSettings(http_port=8710, http_host="0.0.0.0", device_token=SecretStr(DEVICE_TOKEN))
    assert s.device_token is not None and s.device_token.get_secret_value() == DEVICE_TOKEN
    (tmp_path / "device_token").write_text(DEVICE_TOKEN + "\n")
    flags = ["--http-port", "8710", "--http-host", "0.0.0.0"]
    s = settings_from_args([*flags, "--device-token-file", str(tmp_path / "device_token")])
    assert s.device_token is not None and s.device_token.get_secret_value() == DEVICE_TOKEN


@pytest.mark.parametrize("token", ["REPLACE_ME", "changethis", "short"])
def test_a_placeholder_device_token_is_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
        WorkerSettings(http_port=8710, http_host="0.0.0.0", device_token=SecretStr(token))
    (tmp_path / "t").write_text(token)
    with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
        WorkerSettings(device_token_file=tmp_path / "t")


def test_with_a_device_token_every_request_but_healthz_needs_it(
    tmp_path: Path, split: Split
) -> None:
    calls = [
        ("/v1/users/0/recommendations", None),
        ("/v1/users/0/recommendations", WRONG_TOKEN),
        ("/openapi.json", None),
        ("/v2/nothing", None),
        ("/healthz", None),
        ("/v1/users/0/recommendations", WITH_TOKEN),
    ]
    *refused, health, ok = behind_token(tmp_path, split, calls)
    for r in refused:
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        assert r.headers["www-authenticate"] == "Bearer"
    assert health.status_code == 200 and ok.status_code == 200, ok.text


def test_training_items_need_the_device_token_when_one_is_set(tmp_path: Path, split: Split) -> None:
    path = "/v1/users/0/training-items"
    *refused, ok = behind_token(
        tmp_path, split, [(path, None), (path, WRONG_TOKEN), (path, WITH_TOKEN)]
    )
    for r in refused:
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
    assert ok.status_code == 200 and ok.json()["user_id"] == 0


def test_a_worker_process_bound_beyond_loopback_without_a_token_exits_with_a_message(
    tmp_path: Path,
) -> None:
    flags = ["--http-port", "0", "--http-host", "0.0.0.0", "--store", str(tmp_path / "w.db")]
    r = subprocess.run(
        [sys.executable, "-m", "services.client_sim", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "FEDREC_WORKER_DEVICE_TOKEN" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "w.db").exists()
