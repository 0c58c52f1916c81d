"""Load benchmark of the recommendation API against a no-op endpoint, in one run.

Models are trained with the simulator (bench/trained_models.py, cached): Amazon-Video (about
12,000 items) and a synthetic catalogue of 1,000,000 items; request bodies carry the vectors
of that run's own users. Starts, as uvicorn subprocesses on loopback, a no-op FastAPI
endpoint that parses the same JSON body and the recommendation API with its defaults
(two-stage: index candidates re-ranked exactly); drives each with 50 concurrent httpx callers
(bounded by count and time): no-op, two-stage, exact (``"exact": true``), no-op again, and
reports the rates against the mean no-op rate. Then the API on the 1,000,000-item model with
1 and 50 callers and its resident memory. Recall@10 of two-stage against exact ranking is
measured in process per user (mean, 5th percentile, minimum). Client and servers share the
machine's cores: only ratios within one run mean anything. Writes
``bench/results/recommend_load.json`` after each part.

    python -m bench.recommend_load [--quick] [--only 12k|1m]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import torch

from bench import trained_models
from bench.bench_cli import child_command, one_of, opt, writable_file
from fedrecgel.model import ModelConfig
from fedrecgel.wire import encode_model
from harness.loopback import free_port
from services.contract import RecommendationRequest
from services.recommend_api.ranking import RankingConfig
from services.recommend_api.shortlist import ProxyShortlist

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "recommend_load.json"


def trained(name: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A model trained with the simulator (bench/trained_models.py): config, shared
    parameters and the private vectors of every user of its run."""
    data = trained_models.load(name)
    return data["cfg"], data["shared"], data["private"]


def user_bodies(
    cfg: ModelConfig, private: dict[str, torch.Tensor], n: int, k: int = 10
) -> list[dict[str, Any]]:
    """Request bodies with the vectors of ``n`` trained users (a fixed random draw)."""
    rows = torch.randperm(len(private["user_gmf"]), generator=torch.Generator().manual_seed(0))
    out = []
    for j, r in enumerate(rows[:n].tolist()):
        user = {name: private[name][r].tolist() for name in cfg.private_dims()}
        out.append({"user": user, "k": k, "exclude": [str(j % cfg.n_items)]})
    return out


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
    kind: str, model_path: str | None = None, ann_threshold: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server subprocess and wait until it answers."""
    port = free_port()
    cmd = [*child_command(__file__), "--serve", kind, "--port", str(port)]
    if model_path:
        cmd += ["--model", model_path]
    if ann_threshold is not None:
        cmd += ["--ann-threshold", str(ann_threshold)]
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


def server_memory_mb(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    """Resident memory of a server subprocess now and at its peak (Linux /proc), in MB."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = round(
                    int(value.split()[0]) / 1024, 1
                )
    return out


def recall(
    cfg: ModelConfig,
    shared: dict[str, torch.Tensor],
    bodies: list[dict[str, Any]],
    ranking: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Recall@10 of the two-stage ranking (the service's defaults) against exact ranking of
    the same snapshot, per user, in process; with the time of each path per request."""
    from services.recommend_api.ranking import ModelHolder, RankingConfig

    holder = ModelHolder(RankingConfig(ann_threshold=0, **(ranking or {})))
    t0 = time.perf_counter()
    snap = holder.build(cfg, shared, 1)
    build_s = time.perf_counter() - t0
    holder.swap(snap)
    assert snap.shortlist is not None
    recalls, t_two, t_exact = [], 0.0, 0.0
    for b in bodies:
        u, ex = b["user"], b["exclude"]
        t0 = time.perf_counter()
        a = holder.recommend(u["user_gmf"], u.get("user_mlp"), 10, ex).items
        t1 = time.perf_counter()
        e = holder.recommend(u["user_gmf"], u.get("user_mlp"), 10, ex, exact=True).items
        t2 = time.perf_counter()
        t_two += t1 - t0
        t_exact += t2 - t1
        recalls.append(len({i for i, _ in a} & {i for i, _ in e}) / 10)
    r = np.array(recalls)
    return {
        "users": len(bodies),
        "recall_at_10_mean": round(float(r.mean()), 4),
        "recall_at_10_p5": round(float(np.percentile(r, 5)), 4),
        "recall_at_10_min": float(r.min()),
        "candidates": max(holder.config.ann_shortlist, snap.shortlist.min_candidates),
        "candidate_stage": snap.shortlist.kind,
        **(
            {
                "nprobe": holder.config.ann_nprobe,
                "index": type(snap.shortlist.index).__name__,
                "index_dim": snap.shortlist.dim,
            }
            if isinstance(snap.shortlist, ProxyShortlist)
            else {}
        ),
        "snapshot_build_s": round(build_s, 2),
        "two_stage_ms_per_request": round(1000 * t_two / len(bodies), 2),
        "exact_ms_per_request": round(1000 * t_exact / len(bodies), 2),
    }


def _save(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def run_12k(tmp: str, n_req: int, max_s: float, n_recall: int) -> dict[str, Any]:
    """Amazon-Video (trained): no-op, two-stage and exact rates with 50 callers; recall."""
    cfg, shared, private = trained("amazon-video")
    path = os.path.join(tmp, "av.safetensors")
    Path(path).write_bytes(encode_model(cfg, shared, 1))
    bodies = user_bodies(cfg, private, 200)
    exact_bodies = [{**b, "exact": True} for b in bodies]
    out: dict[str, Any] = {"model": "amazon-video (trained)", "n_items": cfg.n_items}
    noop, url = start("noop")
    try:
        out["noop_before"] = asyncio.run(drive(url, bodies, 50, n_req, max_s))
        print("noop", out["noop_before"], flush=True)
        rec, rec_url = start("rec", path)
        try:
            out["rec_two_stage"] = asyncio.run(drive(rec_url, bodies, 50, n_req, max_s))
            print("two-stage", out["rec_two_stage"], flush=True)
            out["rec_exact"] = asyncio.run(drive(rec_url, exact_bodies, 50, n_req, max_s))
            print("exact", out["rec_exact"], flush=True)
            out["server_memory"] = server_memory_mb(rec)
        finally:
            stop(rec)
        out["noop_after"] = asyncio.run(drive(url, bodies, 50, n_req, max_s))
        print("noop", out["noop_after"], flush=True)
    finally:
        stop(noop)
    noop_rate = (out["noop_before"]["req_per_s"] + out["noop_after"]["req_per_s"]) / 2
    for kind in ("two_stage", "exact"):
        out[f"ratio_to_noop_{kind}"] = round(out[f"rec_{kind}"]["req_per_s"] / noop_rate, 3)
    out["recall"] = recall(cfg, shared, user_bodies(cfg, private, n_recall))
    print("recall", out["recall"], flush=True)
    return out


def run_1m(tmp: str, n_req: int, max_s: float, n_recall: int) -> dict[str, Any]:
    """Synthetic 1,000,000 items (trained): latency with 1 and 50 callers, RSS, recall."""
    cfg, shared, private = trained("synthetic-1m")
    path = os.path.join(tmp, "m1m.safetensors")
    Path(path).write_bytes(encode_model(cfg, shared, 1))
    bodies = user_bodies(cfg, private, 200)
    out: dict[str, Any] = {"model": "synthetic-1m (trained)", "n_items": cfg.n_items}
    del shared
    # the same callers against the no-op endpoint in this run: the latency floor of HTTP,
    # JSON parsing and 50 callers sharing this machine's cores
    noop, noop_url = start("noop")
    try:
        out["noop_50"] = asyncio.run(drive(noop_url, bodies, 50, n_req, max_s))
        print("1M noop x50", out["noop_50"], flush=True)
    finally:
        stop(noop)
    t0 = time.perf_counter()
    proc, url = start("rec", path)
    out["server_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        out["server_memory_loaded"] = server_memory_mb(proc)
        out["single_caller"] = asyncio.run(drive(url, bodies, 1, n_req // 3, max_s))
        print("1M single", out["single_caller"], flush=True)
        out["concurrent_50"] = asyncio.run(drive(url, bodies, 50, n_req, max_s))
        print("1M x50", out["concurrent_50"], flush=True)
        out["server_memory"] = server_memory_mb(proc)
        print("1M memory", out["server_memory"], flush=True)
    finally:
        stop(proc)
    out["p99_over_noop_p99_50"] = round(
        out["concurrent_50"]["p99_ms"] / out["noop_50"]["p99_ms"], 2
    )
    if n_recall:  # exact ranking of 1e6 items costs seconds per user
        cfg, shared, private = trained("synthetic-1m")
        out["recall"] = recall(cfg, shared, user_bodies(cfg, private, n_recall))
        print("1M recall", out["recall"], flush=True)
    return out


def main(
    serving: Annotated[str | None, one_of(("rec", "noop"), "--serve")] = None,
    port: int | None = None,
    model: str | None = None,
    ann_threshold: int = RankingConfig().ann_threshold,
    quick: Annotated[bool, opt("smaller counts (smoke run)")] = False,
    only: Annotated[
        str | None, one_of(("12k", "1m"), help="run one part, keep the other's result")
    ] = None,
    out: Annotated[Path, opt("result file", parser=writable_file)] = OUT,
    recall_users_1m: Annotated[int | None, opt("users of the 1e6 recall (0: skip)")] = None,
) -> None:
    """Run the benchmark and write the JSON result (each part as soon as it is measured)."""
    if serving:
        serve(serving, port or 0, model, ann_threshold)
        return

    n_req, max_s = (600, 10.0) if quick else (3000, 30.0)
    result: dict[str, Any] = json.loads(out.read_text()) if only and out.exists() else {}
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }
    result["started"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    result["note"] = (
        "client and servers share this machine's cores; rates are compared within one run"
    )
    command = " ".join(["python -m bench.recommend_load", *sys.argv[1:]])
    with tempfile.TemporaryDirectory() as tmp:
        if only in (None, "12k"):
            result["items_12k_50_callers"] = run_12k(tmp, n_req, max_s, 100 if quick else 500)
            result["items_12k_50_callers"]["command"] = command
            _save(result, out)
        if only in (None, "1m"):
            n_recall = recall_users_1m
            if n_recall is None:
                n_recall = 30 if quick else 100
            result["items_1m"] = run_1m(tmp, n_req, max_s, n_recall)
            result["items_1m"]["command"] = command
            _save(result, out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
