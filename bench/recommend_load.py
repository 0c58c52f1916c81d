"""Load benchmark of the recommendation API against a no-op endpoint, in one run.

Starts, as uvicorn subprocesses on loopback, the recommendation API serving a 12,000-item
NCF model and a no-op FastAPI endpoint that parses the same JSON body; drives each with 50
concurrent httpx callers (bounded by count and time); then the same API on a 1,000,000-item
model (index shortlist + exact re-rank), single caller and concurrent, plus its recall@10
against exact ranking. Writes ``bench/results/recommend_load.json``.

    python bench/recommend_load.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedrecgel.model import ModelConfig, init_shared  # noqa: E402
from fedrecgel.wire import encode_model  # noqa: E402
from services.contract import RecommendationRequest  # noqa: E402
from tests.support.loopback import free_port  # noqa: E402

OUT = ROOT / "bench" / "results" / "recommend_load.json"


def make_model(n_items: int, seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A random FilmTrust-shaped NCF model (factor 32, 3 layers) with trained-like scales."""
    cfg = ModelConfig(n_items=n_items, factor=32, layers=3)
    shared = init_shared(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for t in cfg.item_tables():
        shared[t] = torch.randn(shared[t].shape, generator=g) * 0.1
    return cfg, shared


def user_body(cfg: ModelConfig, seed: int, k: int = 10) -> dict[str, Any]:
    """A request body with a random user vector."""
    g = torch.Generator().manual_seed(10_000 + seed)
    user = {n: (torch.randn(d, generator=g) * 0.1).tolist() for n, d in cfg.private_dims().items()}
    return {"user": user, "k": k, "exclude": [str(seed % cfg.n_items)]}


# ----------------------------------------------------------------------------- servers


def serve(kind: str, port: int, model_path: str | None, ann_threshold: int) -> None:
    """Subprocess entry: run the recommendation API (``rec``) or the no-op app (``noop``)."""
    import uvicorn
    from fastapi import FastAPI

    if kind == "noop":
        app = FastAPI()

        @app.post("/v1/recommendations")
        async def noop(body: RecommendationRequest) -> dict[str, Any]:
            return {"model_version": 0, "items": []}

    else:
        from services.recommend_api.app import create_app
        from services.recommend_api.ranking import ModelHolder, RankingConfig
        from services.recommend_api.settings import Settings

        settings = Settings(aggregator_url=None, ann_threshold=ann_threshold)
        holder = ModelHolder(RankingConfig(ann_threshold=ann_threshold))
        assert model_path is not None
        if not holder.load_bytes(Path(model_path).read_bytes()):
            raise SystemExit("model failed to load")
        app = create_app(settings, holder=holder)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(
    kind: str, model_path: str | None = None, ann_threshold: int = 50_000
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server subprocess and wait until it answers."""
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    if model_path:
        cmd += ["--model", model_path, "--ann-threshold", str(ann_threshold)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        try:
            httpx.get(url + "/docs", timeout=1.0)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server subprocess."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


# ----------------------------------------------------------------------------- driver


async def drive(
    url: str, bodies: list[dict[str, Any]], callers: int, max_requests: int, max_s: float
) -> dict[str, Any]:
    """``callers`` concurrent loops posting bodies until ``max_requests`` or ``max_s``."""
    payloads = [json.dumps(b).encode() for b in bodies]
    latencies: list[float] = []
    errors = 0
    sent = 0
    limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:
        # warm-up
        for p in payloads[:5]:
            await client.post(
                "/v1/recommendations", content=p, headers={"content-type": "application/json"}
            )
        t_end = time.perf_counter() + max_s

        async def loop(i: int) -> None:
            nonlocal errors, sent
            while sent < max_requests and time.perf_counter() < t_end:
                p = payloads[(sent + i) % len(payloads)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post(
                        "/v1/recommendations",
                        content=p,
                        headers={"content-type": "application/json"},
                    )
                    if r.status_code != 200:
                        errors += 1
                except httpx.HTTPError:
                    errors += 1
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(callers)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000.0
    return {
        "callers": callers,
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(wall, 3),
        "req_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "max_ms": round(float(lat.max()), 2),
    }


def recall_at_scale(
    cfg: ModelConfig, shared: dict[str, torch.Tensor], users: int
) -> dict[str, Any]:
    """Recall@10 of shortlist + re-rank vs exact ranking, in process."""
    from services.recommend_api.ranking import ModelHolder, RankingConfig

    holder = ModelHolder(RankingConfig(ann_threshold=0))
    t0 = time.perf_counter()
    snap = holder.build(cfg, shared, 1)
    build_s = time.perf_counter() - t0
    holder.swap(snap)
    exact = ModelHolder(RankingConfig(ann_threshold=10**9))
    exact.swap(exact.build(cfg, shared, 1))
    recalls = []
    for s in range(users):
        b = user_body(cfg, s)
        u = b["user"]
        a = {i for i, _ in holder.recommend(u["user_gmf"], u["user_mlp"], 10).items}
        e = {i for i, _ in exact.recommend(u["user_gmf"], u["user_mlp"], 10).items}
        recalls.append(len(a & e) / 10)
    return {
        "users": users,
        "recall_at_10_mean": round(float(np.mean(recalls)), 3),
        "recall_at_10_min": float(np.min(recalls)),
        "snapshot_build_s": round(build_s, 2),
        "shortlist": holder.config.ann_shortlist,
    }


def main() -> None:
    """Run the benchmark and write the JSON result."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", choices=["rec", "noop"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--model")
    ap.add_argument("--ann-threshold", type=int, default=50_000)
    ap.add_argument("--quick", action="store_true", help="smaller counts (smoke run)")
    ap.add_argument("--skip-million", action="store_true")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.model, args.ann_threshold)
        return

    n_req, max_s = (500, 10.0) if args.quick else (3000, 30.0)
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg, shared = make_model(12_000)
        path = os.path.join(tmp, "m12k.safetensors")
        Path(path).write_bytes(encode_model(cfg, shared, 1))
        bodies = [user_body(cfg, s) for s in range(200)]
        out12: dict[str, Any] = {"n_items": cfg.n_items}
        # rec_exact: whole catalogue through the tower; rec_shortlist: ann_threshold=0
        for kind, thr in (("noop", 0), ("rec_exact", 10**9), ("rec_shortlist", 0)):
            proc, url = start(kind.split("_")[0], path if kind != "noop" else None, thr)
            try:
                out12[kind] = asyncio.run(drive(url, bodies, 50, n_req, max_s))
            finally:
                stop(proc)
            print(kind, out12[kind], flush=True)
        for kind in ("rec_exact", "rec_shortlist"):
            ratio = out12[kind]["req_per_s"] / out12["noop"]["req_per_s"]
            out12[f"ratio_to_noop_{kind.split('_')[1]}"] = round(ratio, 3)
        out12["recall_shortlist"] = recall_at_scale(cfg, shared, 30)
        result["items_12k_50_callers"] = out12

        if not args.skip_million:
            cfg, shared = make_model(1_000_000)
            path = os.path.join(tmp, "m1m.safetensors")
            Path(path).write_bytes(encode_model(cfg, shared, 1))
            bodies = [user_body(cfg, s) for s in range(200)]
            out1m: dict[str, Any] = {"n_items": cfg.n_items, "mode": "index shortlist + exact"}
            proc, url = start("rec", path)
            try:
                m = 200 if args.quick else 1000
                out1m["single_caller"] = asyncio.run(drive(url, bodies, 1, m, max_s))
                print("1M single", out1m["single_caller"], flush=True)
                out1m["concurrent_8"] = asyncio.run(drive(url, bodies, 8, m, max_s))
                print("1M x8", out1m["concurrent_8"], flush=True)
                out1m["concurrent_50"] = asyncio.run(drive(url, bodies, 50, m, max_s))
                print("1M x50", out1m["concurrent_50"], flush=True)
            finally:
                stop(proc)
            out1m["recall"] = recall_at_scale(cfg, shared, 10 if args.quick else 30)
            print("1M recall", out1m["recall"], flush=True)
            result["items_1m"] = out1m
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
