"""Aggregator ingest under load, beside a no-op endpoint receiving the same bodies, same run.

    .venv/bin/python -m bench.aggregator_ingest [--uploads 600] [--concurrency 32]

Both servers run as separate uvicorn processes on loopback. The load: ``--uploads`` distinct
clients of one open round, each sending one realistic update of a FilmTrust-size model
(about 140 sparse item rows of the two tables plus the dense score-network gradient, as a
client with ~28 positives and 4 negatives each uploads), ``--concurrency`` at a time. Every
acknowledged update must be stored: lost = acknowledged - stored (read back from the round).
Writes bench/results/aggregator_ingest.json, and also times a round close (aggregate, server
step, persist a version) with 122 FilmTrust-size updates.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import httpx
import numpy as np
import torch
from fastapi import FastAPI, Request

from bench.bench_cli import OutFile, child_command, opt
from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update
from fedrecgel.wire import encode_updates
from harness.loopback import free_port
from services.enrolment import enrolment_token
from services.launcher import answers_200

ROOT = Path(__file__).resolve().parents[1]

MODEL = ModelConfig(n_items=2059)
TOKEN = "bench-operator-token"
ENROLMENT_SECRET = "bench-enrolment-secret-8f3a91c2"


def realistic_update(client_id: int, rng: np.random.Generator) -> Update:
    """One client's upload: ~140 distinct item rows and the dense tower gradient."""
    rows = np.sort(rng.choice(MODEL.n_items, size=int(rng.integers(60, 220)), replace=False))
    idx = torch.from_numpy(rows)
    shapes = MODEL.shared_shapes()
    return Update(
        client_id=client_id,
        n_samples=int(len(rows) * 1.2),
        rows={t: (idx, torch.randn(len(rows), shapes[t][1]) * 1e-3) for t in MODEL.item_tables()},
        dense={n: torch.randn(shapes[n]) * 1e-3 for n in MODEL.dense_names()},
    )


def noop_server(port: int) -> None:
    """A FastAPI app with the upload path that reads the body and answers like the aggregator."""
    import uvicorn

    app = FastAPI()

    @app.post("/v1/rounds/{round_id}/updates")
    async def upload(round_id: int, request: Request) -> dict[str, object]:
        body = await request.body()
        return {"results": [{"client_id": 0, "status": "accepted", "bytes": len(body)}]}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 60.0,
    log: Path | None = None,
) -> None:
    """Poll ``url`` until it answers 200 (RuntimeError when ``proc`` exits first, with the
    text of ``log``, or after ``timeout_s``)."""

    def alive() -> None:
        if proc is not None and proc.poll() is not None:
            text = "" if log is None else ":\n" + log.read_text(errors="replace")
            raise RuntimeError(f"the server of {url} exited with {proc.returncode}{text}")

    if not answers_200(url, timeout_s, alive, every_s=0.2):
        raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


async def drive(
    base: str, bodies: list[tuple[int, bytes]], token: str, concurrency: int
) -> dict[str, float | int]:
    """Send every body once, ``concurrency`` at a time; latency and status of each."""
    latencies: list[float] = []
    ok = 0
    errors = 0
    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
    for item in bodies:
        queue.put_nowait(item)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}

    async def caller(client: httpx.AsyncClient) -> None:
        nonlocal ok, errors
        while not queue.empty():
            _, body = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                r = await client.post(f"{base}/v1/rounds/1/updates", content=body, headers=headers)
                if r.status_code == 200:
                    ok += 1
                else:
                    errors += 1
            except httpx.HTTPError:
                errors += 1
            latencies.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await asyncio.gather(*(caller(client) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {
        "requests": len(bodies),
        "ok": ok,
        "errors": errors,
        "wall_s": wall,
        "per_s": ok / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def close_time(rounds: int = 5) -> dict[str, object]:
    """Round close (aggregate + server Adam + persist a version) with 122 FilmTrust-size updates."""
    from fastapi.testclient import TestClient

    from harness.aggregator import make_settings, register, sqlite_url
    from services.aggregator.app import create_app

    times = []
    downloads: list[float] = []
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)  # as `python -m services.aggregator` runs by default
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(make_settings(sqlite_url(Path(tmp)), max_body_bytes=64 << 20))
        with TestClient(app) as client:
            token = register(client, list(range(1227)))
            op = {"Authorization": "Bearer test-operator-token"}
            cfg = {"n_items": MODEL.n_items, "rounds": rounds, "fraction": 0.1, "seed": 0}
            assert client.post("/v1/runs", json=cfg, headers=op).status_code == 201
            service = app.state.service
            for r in range(1, rounds + 1):
                cur = client.get("/v1/rounds/current", headers=op).json()
                cohort = cur["cohort"]
                ups = [realistic_update(c, rng) for c in cohort]
                last = ups.pop()
                body = encode_updates(r, ups)
                h = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
                assert (
                    client.post(f"/v1/rounds/{r}/updates", content=body, headers=h).status_code
                    == 200
                )
                # the last upload completes the cohort and closes the round inside its request;
                # time the close itself through the service's own timing where possible
                t0 = time.perf_counter()
                resp = client.post(
                    f"/v1/rounds/{r}/updates", content=encode_updates(r, [last]), headers=h
                )
                assert resp.status_code == 200
                times.append(time.perf_counter() - t0)
                # the new version, as the next round's cohort downloads it
                t1 = time.perf_counter()
                model = client.get("/v1/models/latest", headers=h)
                assert model.headers["X-Model-Version"] == str(r)
                downloads.append(time.perf_counter() - t1)
            registry = app.state.metrics.registry
            close_sum = registry.get_sample_value("fedrec_agg_round_close_seconds_sum")
            close_count = registry.get_sample_value("fedrec_agg_round_close_seconds_count")
            del service
    return {
        "updates_per_round": 122,
        "upload_plus_close_s": times,
        "median_s": statistics.median(times),
        "target_s": 0.1,
        # the close alone, as the aggregator times it (aggregate + server Adam + persist)
        "server_close_mean_s": close_sum / close_count,
        "latest_model_download_s": downloads,
    }


def main(
    uploads: int = 600,
    concurrency: int = 32,
    serve_noop: Annotated[int, opt(None, "--noop-server", hidden=True)] = 0,
    out: OutFile = ROOT / "bench" / "results" / "aggregator_ingest.json",
) -> None:
    """Run both servers, drive them, write the JSON."""
    if serve_noop:
        noop_server(serve_noop)
        return
    rng = np.random.default_rng(0)
    n_clients = uploads + 100  # a cohort larger than the load, so the round stays open
    bodies = [(c, encode_updates(1, [realistic_update(c, rng)])) for c in range(uploads)]
    body_kb = statistics.mean(len(b) for _, b in bodies) / 1024
    results: dict[str, object] = {
        "uploads": uploads,
        "concurrency": concurrency,
        "mean_body_kb": body_kb,
    }
    with tempfile.TemporaryDirectory() as tmp:
        agg_port, noop_port = free_port(), free_port()
        env = {
            **os.environ,
            "FEDREC_AGG_DATABASE_URL": f"sqlite:///{tmp}/agg.db",
            "FEDREC_AGG_OPERATOR_TOKEN": TOKEN,
            "FEDREC_AGG_ENROLMENT_SECRET": ENROLMENT_SECRET,
            "FEDREC_AGG_POPULATION": str(n_clients),
            "FEDREC_AGG_PORT": str(agg_port),
            "FEDREC_AGG_LOG_LEVEL": "warning",
        }
        agg = subprocess.Popen([sys.executable, "-m", "services.aggregator"], env=env)
        noop = subprocess.Popen(
            [*child_command(__file__), "--noop-server", str(noop_port)], cwd=ROOT
        )
        try:
            agg_url, noop_url = f"http://127.0.0.1:{agg_port}", f"http://127.0.0.1:{noop_port}"
            wait_healthy(f"{agg_url}/healthz", agg)
            wait_healthy(f"{noop_url}/healthz", noop)
            enrol = {"Authorization": f"Bearer {enrolment_token(ENROLMENT_SECRET, 0, 1)}"}
            token = httpx.post(
                f"{agg_url}/v1/clients",
                json={"client_ids": list(range(n_clients))},
                headers=enrol,
            ).json()["token"]
            cfg = {
                "n_items": MODEL.n_items,
                "rounds": 1,
                "fraction": 1.0,
                "seed": 0,
                "deadline_s": 3600,
            }
            r = httpx.post(
                f"{agg_url}/v1/runs", json=cfg, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert r.status_code == 201, r.text
            noop_res = asyncio.run(drive(noop_url, bodies, token, concurrency))
            agg_res = asyncio.run(drive(agg_url, bodies, token, concurrency))
            stored = httpx.get(f"{agg_url}/v1/rounds/1").json()["updates_received"]
            agg_res["stored"] = stored
            agg_res["lost"] = int(agg_res["ok"]) - int(stored)
            results["noop"] = noop_res
            results["aggregator"] = agg_res
            results["ratio_to_noop"] = float(agg_res["per_s"]) / float(noop_res["per_s"])
            results["target_ratio"] = 0.5
        finally:
            for p in (agg, noop):
                p.terminate()
                p.wait(10)
    results["round_close"] = close_time()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
