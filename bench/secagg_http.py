"""What secure aggregation costs over HTTP, per round, against plain sparse uploads: the same
FilmTrust run (default settings, 2 shards, negatives from a public pool of ``--pool`` items a
round) once plain, once with ``secure_aggregation=dense`` and once with
``secure_aggregation=sparse`` (which needs the pool), the real aggregator process (SQLite) and
the two workers stepped in this process behind a recording transport, so every body on the
wire is counted.

Bytes are exact (request and response bodies, by endpoint family, with the seconds each
family's requests took to be answered); seconds are the wall time of each run divided by its
rounds (the workers take turns in one process, in every arm
alike). The machine is shared and its speed drifts by tens of percent from minute to minute,
so the three arms run ``--repeats`` times, interleaved (each repeat in a rotated order): an
arm's seconds are the median of its runs, and a ratio the median of the repeats' ratios.
Writes ``bench/results/secagg_http.json``.

    nice -n 0 .venv/bin/python -m bench.secagg_http [--rounds 3] [--fraction 0.1] [--pool 128]
        [--repeats 3]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.bench_cli import Positive
from fedrecgel.data import load_split
from fedrecgel.secagg.layout import vector_length
from fedrecgel.simulate import TrainConfig
from harness.parity import aggregator_started, parity_options
from harness.stepped import Stepped
from services.launcher import worker_torch_threads

DATASET = "filmtrust"
OUT = Path(__file__).resolve().parent / "results" / "secagg_http.json"


def family(method: str, path: str) -> str:
    """The endpoint family of a recorded exchange."""
    if "/secagg" in path:
        return "secagg " + (path.rsplit("/", 1)[1] if method == "POST" else "GET")
    if path.endswith("/updates"):
        return "updates"
    if path.startswith("/v1/models"):
        return "models"
    return "other"


#: the arms: plain uploads and the two secure-aggregation modes
MODES = ("off", "dense", "sparse")


def one_run(mode: str, rounds: int, fraction: float, pool: int, workdir: Path) -> dict[str, Any]:
    """One run of ``rounds`` rounds; its bytes by family and seconds per round."""
    split = load_split(DATASET)
    train = TrainConfig(
        rounds=rounds,
        shards=2,
        fraction=fraction,
        negative_pool=pool,
        secure_aggregation=mode,  # type: ignore[arg-type]
    )
    opts = parity_options(train, DATASET, workdir, workers=2, worker_poll_max_s=0.5)
    with aggregator_started(opts) as c:
        s = Stepped(c, split, keep_bodies=False)  # their sizes only
        try:
            s.start(split)
            t0 = time.perf_counter()
            s.step(timeout_s=3600.0)
            wall = time.perf_counter() - t0
            history, _ = s.result()
        finally:
            s.close()
    assert len(history["rounds"]) == rounds, history
    fams: dict[str, dict[str, float]] = {}
    for ex in s.recorder.exchanges:
        f = fams.setdefault(
            family(ex.method, ex.path), {"requests": 0, "sent": 0, "received": 0, "seconds": 0.0}
        )
        f["requests"] += 1
        f["sent"] += ex.request_bytes
        f["received"] += ex.response_bytes
        f["seconds"] += ex.seconds
    training = {k: v for k, v in fams.items() if k.startswith("secagg") or k == "updates"}
    return {
        "cohort": history["rounds"][0]["n_updates"],
        "seconds_per_round": wall / rounds,
        "upload_bytes_per_round": sum(v["sent"] for v in training.values()) / rounds,
        "secagg_download_bytes_per_round": sum(
            v["received"] for k, v in training.items() if k == "secagg GET"
        )
        / rounds,
        "bytes_by_family": fams,
        "losses": [r["loss"] for r in history["rounds"]],
    }


def main(
    rounds: Positive = 3,
    fraction: float = TrainConfig().fraction,
    pool: int = 128,
    repeats: Positive = 3,
) -> None:
    """Run the three arms ``repeats`` times, interleaved, and write the JSON."""
    torch.set_num_threads(worker_torch_threads(2))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {
        "dataset": DATASET,
        "rounds": rounds,
        "fraction": fraction,
        "command": f"nice -n 0 .venv/bin/python -m bench.secagg_http --rounds {rounds} "
        f"--fraction {fraction:g} --pool {pool} --repeats {repeats}",
        "negative_pool": pool,
        "repeats": repeats,
        "note": "same-run ratios on a shared loaded machine, medians of interleaved repeats; "
        "workers stepped in one process",
    }
    split = load_split(DATASET)
    out["vector_length"] = vector_length(TrainConfig().model(split.n_items))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(repeats):
            for mode in MODES[n % len(MODES) :] + MODES[: n % len(MODES)]:
                arm = one_run(mode, rounds, fraction, pool, Path(tmp) / f"{mode}-{n}")
                runs[mode].append(arm)
                print(mode, json.dumps({k: v for k, v in arm.items() if k != "bytes_by_family"}))
    for mode, arms in runs.items():
        seconds = [a["seconds_per_round"] for a in arms]
        out[mode] = {
            **arms[0],
            "seconds_per_round": statistics.median(seconds),
            "seconds_per_round_runs": seconds,
        }
    out["ratio"] = {}
    for a, b in (("dense", "off"), ("sparse", "off"), ("sparse", "dense")):
        each = [x / y for x, y in zip(_seconds(out[a]), _seconds(out[b]), strict=True)]
        out["ratio"][f"{a}/{b}"] = {
            "upload_bytes": out[a]["upload_bytes_per_round"] / out[b]["upload_bytes_per_round"],
            "bytes": _bytes(out[a]) / _bytes(out[b]),
            "seconds": statistics.median(each),
            "seconds_runs": each,
        }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print("ratios", out["ratio"], "->", OUT)


def _seconds(arm: dict[str, Any]) -> list[float]:
    """An arm's seconds per round, one a repeat."""
    return [float(x) for x in arm["seconds_per_round_runs"]]


def _bytes(arm: dict[str, Any]) -> float:
    """An arm's training bytes per round, both ways (uploads and secure-aggregation reads)."""
    return float(arm["upload_bytes_per_round"] + arm["secagg_download_bytes_per_round"])


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
