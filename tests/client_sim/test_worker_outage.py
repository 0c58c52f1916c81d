"""A worker's upload outlives a database outage of the aggregator longer than 3 s: the real
aggregator (uvicorn on loopback, on PostgreSQL) answers 503 with Retry-After while its database
refuses connections, and the worker, on its default retry settings (services/retry.py), waits
as told and delivers the same upload once the database is back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import psycopg
from pydantic import SecretStr

from fedrecgel.synthetic import synthetic_split
from services.aggregator.app import create_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.enrolment import enrolment_token
from tests.client_sim.worker_run import run_body
from tests.support.aggregator import ENROLMENT_SECRET, OPERATOR_TOKEN, make_settings
from tests.support.loopback import serve_app

N_USERS = 30
#: how long the database refuses connections: longer than the 3 s after which a worker used to
#: give up, shorter than the aggregator's Retry-After plus the worker's deadline
OUTAGE_S = 4.0


class DatabaseOutage:
    """Takes a PostgreSQL database away (no new connections, the open ones ended) and gives
    it back ``OUTAGE_S`` later, from a timer."""

    def __init__(self, url: str) -> None:
        self.name = url.rsplit("/", 1)[1]
        admin = url.rsplit("/", 1)[0].replace("postgresql+psycopg://", "postgresql://")
        self.admin = f"{admin}/postgres"
        self.began: float | None = None
        self.ended: float | None = None
        self._timer: threading.Timer | None = None

    def _allow(self, allowed: bool) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(
                f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}'
            )
            if not allowed:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (self.name,),
                )

    def start(self) -> None:
        self._allow(False)
        self.began = time.monotonic()
        self._timer = threading.Timer(OUTAGE_S, self.end)
        self._timer.start()

    def end(self) -> None:
        self._allow(True)
        self.ended = time.monotonic()

    def join(self) -> None:
        if self._timer is not None:
            self._timer.join()


class OutageOnFirstUpload(httpx.BaseTransport):
    """Real HTTP; the database goes away just before the worker's first upload is sent.
    Records (time, status) of every upload attempt."""

    def __init__(self, outage: DatabaseOutage) -> None:
        self.inner = httpx.HTTPTransport()
        self.outage = outage
        self.uploads: list[tuple[float, int, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        upload = request.method == "POST" and request.url.path.endswith("/updates")
        if upload and self.outage.began is None:
            self.outage.start()
        response = self.inner.handle_request(request)
        if upload:
            response.read()
            retry_after = response.headers.get("Retry-After")
            self.uploads.append((time.monotonic(), response.status_code, retry_after))
        return response

    def close(self) -> None:
        self.inner.close()


def test_the_upload_waits_out_a_database_outage_longer_than_3_s(
    tmp_path: Path, postgres_url: str
) -> None:
    split = synthetic_split(n_users=N_USERS, n_items=60, seed=3, n_test_negatives=20)
    settings = make_settings(postgres_url, population=N_USERS, deadline_poll_s=0.2)
    outage = DatabaseOutage(postgres_url)
    transport = OutageOnFirstUpload(outage)
    with serve_app(create_app(settings), timeout_s=30, log_level="warning") as url:
        worker = Worker(
            WorkerSettings(
                aggregator=url,
                enrolment_token=SecretStr(enrolment_token(ENROLMENT_SECRET, 0, 1)),
                dataset="synthetic",
                store=str(tmp_path / "worker-0.db"),
            ),
            split=split,
            transport=transport,
        )
        try:
            worker.register()
            with httpx.Client(base_url=url) as http:
                resp = http.post(
                    "/v1/runs",
                    json=run_body(split.n_items, 5, rounds=1, deadline_s=600.0),
                    headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
                )
                assert resp.status_code == 201, resp.text
                assert worker.step()  # polls, trains, uploads (through the outage), commits
                outage.join()
                history = http.get("/v1/runs/current/history").json()
        finally:
            outage.join()
            worker.close()
    assert outage.began is not None and outage.ended is not None
    assert outage.ended - outage.began >= OUTAGE_S > 3.0
    refused = [(t, s, ra) for t, s, ra in transport.uploads if s == 503]
    assert refused, transport.uploads
    assert all(ra is not None and int(ra) > 0 for _, _, ra in refused)
    # the Retry-After was waited out: no attempt came sooner than it asked after a refusal
    times = [t for t, _, _ in transport.uploads]
    for (t, _, ra), later in zip(transport.uploads, times[1:], strict=False):
        assert later - t >= float(ra or 0), transport.uploads
    last_time, last_status, _ = transport.uploads[-1]
    assert last_status == 200 and last_time > outage.ended, transport.uploads
    # stored and aggregated once the database was back: the round closed with the upload
    assert [r["round_id"] for r in history["rounds"]] == [1], history
    assert history["rounds"][0]["n_updates"] > 0, history
