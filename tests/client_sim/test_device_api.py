"""The worker's demo HTTP API against the real recommend_api app, in one process; shard options."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import PrivateState
from fedrecgel.synthetic import synthetic_split
from services.client_sim.cli import settings_from_args
from services.client_sim.routes import device_request
from services.client_sim.server import DeviceApiServer, create_app, item_labels
from services.client_sim.settings import WorkerSettings, hostname_ordinal
from services.client_sim.store import WorkerStore
from services.client_sim.worker import Worker
from services.recommend_api.app import create_app as create_recommend_app
from services.recommend_api.ranking import ModelHolder
from services.recommend_api.settings import Settings as RecommendSettings
from tests.fake_aggregator import FakeAggregator, enrolment_for, worker_settings

CFG = ModelConfig(n_items=30, factor=4, layers=2)
SEED = 7
DEVICE_TOKEN = "device-token-0123456789abcdef"
LABELS = [f"film-{i}" for i in range(CFG.n_items)]


@pytest.fixture(scope="module")
def split():
    return synthetic_split(n_users=12, n_items=CFG.n_items, seed=3, n_test_negatives=10)


def _settings(tmp_path: Path, **kw: Any) -> WorkerSettings:
    return worker_settings(tmp_path, **{"recommend_url": "http://rec", **kw})


def _store(tmp_path: Path, split, with_state: bool = True) -> WorkerStore:
    """Shard 0 of 2 (the even users), with fresh private states unless ``with_state`` is off."""
    store = WorkerStore(tmp_path / "w.db")
    users = [u for u in range(split.n_users) if u % 2 == 0]
    store.add_users(split, users)
    if with_state:
        store.reset_states(users, PrivateState.fresh(CFG, SEED, np.asarray(users)))
    return store


def _holder(version: int | None = 4) -> ModelHolder:
    holder = ModelHolder(labels=LABELS)
    if version is not None:
        holder.swap(holder.build(CFG, init_shared(CFG, 1), version))
    return holder


@asynccontextmanager
async def _worker_api(
    settings: WorkerSettings,
    store: WorkerStore,
    rec_transport: httpx.AsyncBaseTransport,
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, store, LABELS, transport=rec_transport)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            yield client


@asynccontextmanager
async def _both(
    settings: WorkerSettings, store: WorkerStore, holder: ModelHolder
) -> AsyncIterator[httpx.AsyncClient]:
    """The worker API calling the real recommend_api app (lifespan started, no aggregator)."""
    rec = create_recommend_app(RecommendSettings(aggregator_url=None, workers=2), holder=holder)
    async with (
        rec.router.lifespan_context(rec),
        _worker_api(settings, store, httpx.ASGITransport(app=rec)) as client,
    ):
        yield client


def test_recommendations_are_recommend_api_answer_for_the_users_own_vector(tmp_path, split):
    store, holder, user = _store(tmp_path, split), _holder(4), 4

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, holder) as c:
            return await c.get(f"/v1/users/{user}/recommendations", params={"k": 5})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    body = r.json()
    params = store.load_states([user]).params
    train = sorted({int(i) for i in split.user_train(user)})
    expected = holder.recommend(
        params["user_gmf"][0].tolist(),
        params["user_mlp"][0].tolist(),
        5,
        [LABELS[i] for i in train],
    )
    assert body["model_version"] == 4
    assert [(it["item"], pytest.approx(it["score"])) for it in body["items"]] == expected.items
    assert not {it["item"] for it in body["items"]} & {LABELS[i] for i in train}
    assert set(body) == {"model_version", "items"}  # never the user vector


def test_device_request_excludes_training_items_once_by_label(tmp_path, split):
    store = _store(tmp_path, split)
    body = device_request(store, LABELS, 2, 10)
    train = sorted({int(i) for i in split.user_train(2)})
    assert body["exclude"] == [LABELS[i] for i in train] and body["k"] == 10
    assert set(body["user"]) == {"user_gmf", "user_mlp"}
    assert device_request(store, None, 2, 3)["exclude"] == [str(i) for i in train]


def test_user_of_another_shard_is_404(tmp_path, split):
    store = _store(tmp_path, split)

    async def go() -> list[httpx.Response]:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return [
                await c.get("/v1/users/3/recommendations"),  # odd: shard 1
                await c.get(f"/v1/users/{split.n_users + 10}/recommendations"),
            ]

    for r in asyncio.run(go()):
        assert r.status_code == 404
        assert r.json()["error"] == "unknown_user"


@pytest.mark.parametrize("k", ["0", "-1", "1001", "ten"])
def test_bad_k_is_422(tmp_path, split, k):
    store = _store(tmp_path, split)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return await c.get("/v1/users/0/recommendations", params={"k": k})

    r = asyncio.run(go())
    assert r.status_code == 422
    assert r.json()["error"] == "validation_error" and "k" in r.json()["detail"]


def test_non_integer_user_is_422(tmp_path, split):
    store = _store(tmp_path, split)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return await c.get("/v1/users/abc/recommendations")

    assert asyncio.run(go()).status_code == 422


def test_user_without_private_state_is_503(tmp_path, split):
    store = _store(tmp_path, split, with_state=False)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return await c.get("/v1/users/0/recommendations")

    r = asyncio.run(go())
    assert r.status_code == 503 and r.json()["error"] == "no_private_state"


def test_recommend_api_without_a_model_passes_its_503_through(tmp_path, split):
    store = _store(tmp_path, split)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder(None)) as c:
            return await c.get("/v1/users/0/recommendations")

    r = asyncio.run(go())
    assert r.status_code == 503 and r.json()["error"] == "no_model"


def test_unreachable_or_refusing_recommend_api_is_502(tmp_path, split):
    store = _store(tmp_path, split)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def refuses(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": "unknown_items", "detail": "'film-1'"})

    async def go(handler) -> httpx.Response:
        async with _worker_api(_settings(tmp_path), store, httpx.MockTransport(handler)) as c:
            return await c.get("/v1/users/0/recommendations")

    r = asyncio.run(go(down))
    assert r.status_code == 502 and r.json()["error"] == "recommend_unavailable"
    r = asyncio.run(go(refuses))
    assert r.status_code == 502 and "unknown_items" in r.json()["detail"]


def test_healthz_reports_the_shard(tmp_path, split):
    store = _store(tmp_path, split)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return await c.get("/healthz")

    r = asyncio.run(go())
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "store": "ok",
        "registered": False,
        "shard": 0,
        "shards": 2,
        "users": 6,
    }
    store.set_meta(token="t")
    assert asyncio.run(go()).json()["registered"] is True


def test_http_server_thread_serves_and_stops(tmp_path, split):
    store = _store(tmp_path, split)
    app = create_app(_settings(tmp_path), store, LABELS)
    server = DeviceApiServer(app, "127.0.0.1", 0, "warning")
    server.start()
    try:
        r = httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5.0)
        assert r.status_code == 200 and r.json()["users"] == 6
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=1.0)


def test_item_labels_follow_the_recommend_item_ids_setting(tmp_path, split):
    assert item_labels(_settings(tmp_path, recommend_item_ids="index"), split) is None
    labels = item_labels(_settings(tmp_path), split)
    assert labels == [str(x) for x in split.item_labels.tolist()]


def test_http_options_from_flags_and_environment(monkeypatch):
    monkeypatch.setenv("FEDREC_WORKER_HTTP_PORT", "8710")
    monkeypatch.setenv("FEDREC_WORKER_RECOMMEND_URL", "http://rec:8702")
    monkeypatch.setenv("FEDREC_WORKER_DEVICE_TOKEN", DEVICE_TOKEN)
    s = settings_from_args(["--http-host", "0.0.0.0"])
    assert (s.http_port, s.http_host, s.recommend_url) == (8710, "0.0.0.0", "http://rec:8702")
    s = settings_from_args(["--http-port", "9000", "--recommend-item-ids", "index"])
    assert s.http_port == 9000 and s.recommend_item_ids == "index"
    monkeypatch.delenv("FEDREC_WORKER_HTTP_PORT")
    assert WorkerSettings().http_port is None  # off by default
    with pytest.raises(ValueError):
        WorkerSettings(http_port=70000)


@pytest.mark.parametrize(
    ("hostname", "shard"),
    [("worker-0", 0), ("fedrec-worker-12", 12), ("worker-3.worker.fedrec.svc.cluster.local", 3)],
)
def test_shard_from_hostname_reads_the_statefulset_ordinal(hostname, shard):
    assert hostname_ordinal(hostname) == shard


@pytest.mark.parametrize("hostname", ["worker", "3f2a9c1b7d4e", "worker-", "worker-1a"])
def test_hostname_without_an_ordinal_is_refused(hostname):
    with pytest.raises(ValueError, match="ordinal"):
        hostname_ordinal(hostname)


def test_shard_from_hostname_setting_overrides_shard_and_names_the_store(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "worker-2")
    s = WorkerSettings(shard_from_hostname=True, shards=4, store="/data/worker-{shard}.db")
    assert s.shard == 2 and s.store == "/data/worker-2.db"
    with pytest.raises(ValueError, match="shard"):
        WorkerSettings(shard_from_hostname=True, shards=2)  # ordinal 2 of 2 shards
    monkeypatch.setenv("FEDREC_WORKER_SHARD_FROM_HOSTNAME", "true")
    monkeypatch.setenv("FEDREC_WORKER_SHARDS", "3")
    assert settings_from_args([]).shard == 2


def test_worker_waits_for_an_aggregator_that_is_not_up_yet(tmp_path, split):
    fake = FakeAggregator()
    waits: list[float] = []
    settings = _settings(tmp_path, shards=1, retries=0, max_rounds=1)

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
        w.run()
    finally:
        w.close()
    assert len(fake.registered) == split.n_users
    assert w.evaluated_version() == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_process_serves_while_waiting_for_the_aggregator_and_stops_on_sigterm(tmp_path):
    """`python -m services.client_sim --http-port`: /healthz answers before the aggregator is
    up (registration waits), and SIGTERM ends the process promptly (as `docker stop` sends)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "services.client_sim",
        "--aggregator",
        f"http://127.0.0.1:{_free_port()}",  # nothing listens there
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


def test_the_device_api_listens_on_loopback_unless_told_and_then_needs_a_token(tmp_path):
    assert WorkerSettings(http_port=8710).http_host == "127.0.0.1"
    assert WorkerSettings(http_port=8710, http_host="::1").device_token is None
    for host in ("0.0.0.0", "10.1.2.3", "worker-0"):
        with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
            WorkerSettings(http_port=8710, http_host=host)
    s = WorkerSettings(http_port=8710, http_host="0.0.0.0", device_token=DEVICE_TOKEN)
    assert s.device_token is not None and s.device_token.get_secret_value() == DEVICE_TOKEN
    (tmp_path / "device_token").write_text(DEVICE_TOKEN + "\n")
    flags = ["--http-port", "8710", "--http-host", "0.0.0.0"]
    s = settings_from_args([*flags, "--device-token-file", str(tmp_path / "device_token")])
    assert s.device_token is not None and s.device_token.get_secret_value() == DEVICE_TOKEN


@pytest.mark.parametrize("token", ["REPLACE_ME", "changethis", "short"])
def test_a_placeholder_device_token_is_refused(tmp_path, token):
    with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
        WorkerSettings(http_port=8710, http_host="0.0.0.0", device_token=token)
    (tmp_path / "t").write_text(token)
    with pytest.raises(ValueError, match="FEDREC_WORKER_DEVICE_TOKEN"):
        WorkerSettings(device_token_file=tmp_path / "t")


def test_with_a_device_token_every_request_but_healthz_needs_it(tmp_path, split):
    store = _store(tmp_path, split)
    settings = _settings(tmp_path, http_host="0.0.0.0", device_token=DEVICE_TOKEN)
    good = {"Authorization": f"Bearer {DEVICE_TOKEN}"}

    async def go() -> list[httpx.Response]:
        async with _both(settings, store, _holder()) as c:
            return [
                await c.get("/v1/users/0/recommendations"),
                await c.get("/v1/users/0/recommendations", headers={"Authorization": "Bearer x"}),
                await c.get("/openapi.json"),
                await c.get("/v2/nothing"),
                await c.get("/healthz"),
                await c.get("/v1/users/0/recommendations", headers=good),
            ]

    *refused, health, ok = asyncio.run(go())
    for r in refused:
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        assert r.headers["www-authenticate"] == "Bearer"
    assert health.status_code == 200 and ok.status_code == 200, ok.text


def test_a_worker_process_bound_beyond_loopback_without_a_token_exits_with_a_message(tmp_path):
    flags = ["--http-port", "0", "--http-host", "0.0.0.0", "--store", str(tmp_path / "w.db")]
    r = subprocess.run(
        [sys.executable, "-m", "services.client_sim", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "FEDREC_WORKER_DEVICE_TOKEN" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "w.db").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/users/0/recommendations?k=10.0",
        "/v1/users/0/recommendations?k=%2B10",
        "/v1/users/0/recommendations?k=010",
        "/v1/users/0/recommendations?k=1_0",
        "/v1/users/0/recommendations?k=true",
        "/v1/users/0.0/recommendations",
        "/v1/users/%2B0/recommendations",
        "/v1/users/1_0/recommendations",
    ],
)
def test_integers_in_paths_and_queries_are_plain_decimal(tmp_path, split, path):
    store = _store(tmp_path, split)

    async def go() -> httpx.Response:
        async with _both(_settings(tmp_path), store, _holder()) as c:
            return await c.get(path)

    r = asyncio.run(go())
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error"


def test_405_names_the_allowed_methods_and_bodies_are_bounded(tmp_path, split):
    store = _store(tmp_path, split)

    async def go() -> list[httpx.Response]:
        async with _both(_settings(tmp_path, http_max_body_bytes=1024), store, _holder()) as c:
            return [
                await c.post("/v1/users/0/recommendations"),
                await c.request("GET", "/v1/users/0/recommendations", content=b"x" * 2048),
            ]

    not_allowed, too_large = asyncio.run(go())
    assert not_allowed.status_code == 405 and not_allowed.headers["allow"] == "GET"
    assert not_allowed.json()["error"] == "method_not_allowed"
    assert too_large.status_code == 413 and too_large.json()["error"] == "body_too_large"


def test_the_device_reads_its_own_training_items_and_may_rank_them_too(tmp_path, split):
    store, holder, user = _store(tmp_path, split, with_state=False), _holder(4), 2
    train = [LABELS[i] for i in sorted({int(i) for i in split.user_train(user)})]

    async def go() -> list[httpx.Response]:
        async with _both(_settings(tmp_path), store, holder) as c:
            items = await c.get(f"/v1/users/{user}/training-items")  # no private state needed
            store.reset_states([user], PrivateState.fresh(CFG, SEED, np.asarray([user])))
            return [
                items,
                await c.get(f"/v1/users/{user}/recommendations?k=30&include_training=true"),
                await c.get(f"/v1/users/{user}/recommendations?k=30&include_training=false"),
                await c.get(f"/v1/users/{user}/recommendations?include_training=yes"),
                await c.get("/v1/users/3/training-items"),  # shard 1
                await c.get(f"/v1/users/{split.n_users + 10}/training-items"),
                await c.get("/v1/users/%2B2/training-items"),
            ]

    items, with_train, without, bad_flag, *unknown, bad_id = asyncio.run(go())
    assert items.status_code == 200, items.text
    assert items.json() == {"user_id": user, "items": train} and train
    # include_training: every item ranked (the training items among them), else left out
    ranked = [it["item"] for it in with_train.json()["items"]]
    assert sorted(ranked) == sorted(LABELS)
    params = store.load_states([user]).params
    expected = holder.recommend(
        params["user_gmf"][0].tolist(), params["user_mlp"][0].tolist(), 30, []
    )
    assert ranked == [item for item, _ in expected.items]
    kept = [it["item"] for it in without.json()["items"]]
    assert sorted(kept) == sorted(set(LABELS) - set(train))
    assert bad_flag.status_code == 422 and bad_id.status_code == 422
    for r in unknown:
        assert r.status_code == 404 and r.json()["error"] == "unknown_user", r.text


def test_training_items_need_the_device_token_when_one_is_set(tmp_path, split):
    store = _store(tmp_path, split)
    settings = _settings(tmp_path, http_host="0.0.0.0", device_token=DEVICE_TOKEN)

    async def go() -> list[httpx.Response]:
        async with _both(settings, store, _holder()) as c:
            return [
                await c.get("/v1/users/0/training-items"),
                await c.get("/v1/users/0/training-items", headers={"Authorization": "Bearer x"}),
                await c.get(
                    "/v1/users/0/training-items",
                    headers={"Authorization": f"Bearer {DEVICE_TOKEN}"},
                ),
            ]

    *refused, ok = asyncio.run(go())
    for r in refused:
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
    assert ok.status_code == 200 and ok.json()["user_id"] == 0
