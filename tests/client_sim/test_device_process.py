"""The worker's demo HTTP API served for real: the server thread, and the worker process serving
while it waits for an aggregator that is not up yet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fedrecgel.data import Split
from services.client_sim.loop import follow_rounds
from services.client_sim.server import DeviceApiServer, create_app
from services.client_sim.worker import Worker
from tests.client_sim.device_api import (
    LABELS,
    device_split,
    settings_for,
    shard_store,
)
from tests.fake_aggregator import FakeAggregator, enrolment_for
from tests.support.loopback import free_port


@pytest.fixture(scope="module")
def split() -> Split:
    return device_split()


def test_http_server_thread_serves_and_stops(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)
    app = create_app(settings_for(tmp_path), store, LABELS)
    server = DeviceApiServer(app, "127.0.0.1", 0, "warning")
    server.start()
    try:
        r = httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5.0)
        assert r.status_code == 200 and r.json()["users"] == 6
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=1.0)


def test_without_a_device_token_only_requests_addressed_to_loopback_are_answered(
    tmp_path: Path, split: Split
) -> None:
    # a web page that points a DNS name at 127.0.0.1 (DNS rebinding) reaches the server, but
    # its requests carry that name in Host: they must not read a user's training items
    store = shard_store(tmp_path, split)
    server = DeviceApiServer(create_app(settings_for(tmp_path), store, LABELS), "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/v1/users/0/training-items"
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "[::1]:8710"):
            assert httpx.get(url, headers={"Host": host}, timeout=5.0).status_code == 200, host
        for host in (f"evil.example:{server.port}", "127.0.0.1.evil.example", "[fe80::1]:8710"):
            r = httpx.get(url, headers={"Host": host}, timeout=5.0)
            assert (r.status_code, r.json()["error"]) == (403, "host_not_allowed"), host
        healthz = f"http://127.0.0.1:{server.port}/healthz"
        assert httpx.get(healthz, headers={"Host": "probe:1"}, timeout=5.0).status_code == 200
    finally:
        server.stop()


def test_worker_waits_for_an_aggregator_that_is_not_up_yet(tmp_path: Path, split: Split) -> None:
    fake = FakeAggregator()
    waits: list[float] = []
    settings = settings_for(tmp_path, shards=1, retries=0, max_rounds=1)

    class Waiter:
        def wait(self, seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:  # the run starts once the worker is registered
                fake.start_run(n_items=split.n_items, factor=4, layers=2, dataset="synthetic")

        def close(self) -> None:
            pass

    fake.failures = [503, 502]  # two failed registrations, then the aggregator answers
    w = Worker(settings, split=split, transport=fake.transport(), waiter=Waiter())
    try:
        follow_rounds(w)
    finally:
        w.close()
    assert len(fake.registered) == split.n_users
    assert w.evaluated_version() == 1


def test_worker_process_serves_while_waiting_for_the_aggregator_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """`python -m services.client_sim --http-port`: /healthz answers before the aggregator is
    up (registration waits), and SIGTERM ends the process promptly (as `docker stop` sends)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "services.client_sim",
        "--aggregator",
        f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "--store",
        str(tmp_path / "w-{shard}.db"),
        "--shard",
        "1",
        "--shards",
        "40",
        "--http-port",
        str(port),
        "--poll-max-s",
        "0.5",
    ]
    env = {**os.environ, "FEDREC_WORKER_ENROLMENT_TOKEN": enrolment_for(1, 40)}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 60
        body = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert body is not None, proc.stderr.read() if proc.stderr else ""
        assert body["registered"] is False and body["shard"] == 1 and body["users"] > 0
        assert (tmp_path / "w-1.db").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
