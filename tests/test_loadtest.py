"""The locustfile really loads: headless locust against a live aggregator process on loopback.

Locust's simulated clients register, follow rounds, download the model and upload updates; the
test starts a run once they are registered and checks afterwards, from locust's own statistics
and from the aggregator, that uploads were stored and that no request failed.
"""

from __future__ import annotations

import csv
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.enrolment import enrolment_token
from tests.support.loopback import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
USERS = 12


def _locust() -> str:
    exe = Path(sys.executable).with_name("locust")
    if exe.exists():
        return str(exe)
    found = shutil.which("locust")
    if found is None:
        pytest.skip("locust is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.slow
def test_locust_headless_stores_uploads_without_failures(tmp_path: Path) -> None:
    locust = _locust()
    port = free_port()
    operator = secrets.token_hex(16)
    enrolment_secret = secrets.token_hex(16)
    env = {
        **os.environ,
        "FEDREC_AGG_DATABASE_URL": f"sqlite:///{tmp_path / 'agg.db'}",
        "FEDREC_AGG_OPERATOR_TOKEN": operator,
        "FEDREC_AGG_ENROLMENT_SECRET": enrolment_secret,
        "FEDREC_AGG_POPULATION": str(10 * USERS),
        "FEDREC_AGG_HOST": "127.0.0.1",
        "FEDREC_AGG_PORT": str(port),
        "FEDREC_AGG_LOG_LEVEL": "warning",
    }
    base = f"http://127.0.0.1:{port}"
    agg_log = (tmp_path / "aggregator.log").open("wb")
    agg = subprocess.Popen(
        [sys.executable, "-m", "services.aggregator"],
        env=env,
        stdout=agg_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    load: subprocess.Popen[bytes] | None = None
    try:
        assert wait_for_port(port, timeout=60), (tmp_path / "aggregator.log").read_text()
        load = subprocess.Popen(
            [
                locust,
                "-f",
                str(LOCUSTFILE),
                "AggregatorClient",
                "--headless",
                "-u",
                str(USERS),
                "-r",
                str(USERS),
                "-t",
                "25s",
                "--host",
                base,
                "--csv",
                str(tmp_path / "stats"),
                "--only-summary",
                "--exit-code-on-error",
                "1",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "FEDREC_LOAD_ENROLMENT_TOKEN": enrolment_token(enrolment_secret, 0, 1),
            },
            stdout=(tmp_path / "locust.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/v1/clients/count").json()["registered"] < USERS:
            assert time.monotonic() < deadline, "locust users did not register"
            time.sleep(0.2)
        r = httpx.post(
            f"{base}/v1/runs",
            headers={"Authorization": f"Bearer {operator}"},
            json={"n_items": 2059, "rounds": 1000, "fraction": 1.0, "deadline_s": 20},
        )
        assert r.status_code == 201, r.text
        code = load.wait(timeout=120)
        log = (tmp_path / "locust.log").read_text()
        with (tmp_path / "stats_stats.csv").open() as fh:
            rows = {row["Name"]: row for row in csv.DictReader(fh)}
        assert code == 0, log
        assert int(rows["Aggregated"]["Failure Count"]) == 0, log
        assert int(rows["upload"]["Request Count"]) >= USERS, rows["upload"]
        history = httpx.get(f"{base}/v1/runs/current/history").json()
        stored = sum(rnd["n_updates"] for rnd in history["rounds"])
        assert len(history["rounds"]) >= 1 and stored >= USERS, history
    finally:
        for proc in (load, agg):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        agg_log.close()
