"""Storage across runs: the aggregator's SQLite database over 20 runs started one after the
other (what 20 ``docker compose up``/``down`` cycles of the demo do to a kept volume), with the
run retention (``KEEP_RUNS``, default 10) and without it (every run keeps its versions), in one
process, the two interleaved cycle by cycle.

    .venv/bin/python -m bench.run_retention [--runs 20] [--rounds 3]

Each cycle starts a run of a FilmTrust-sized model (2,071 items, the default NCF), plays
``--rounds`` rounds of random per-client updates through the HTTP API (an in-process app),
stops the run, then lets the storage pass and the compaction run (what the aggregator's
background thread does after a close) and records the database's bytes (file, WAL and
shared memory). Writes ``bench/results/run_retention.json``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from bench.bench_cli import OutFile, Positive
from fedrecgel.run_config import RunConfig
from fedrecgel.wire import encode_updates
from harness.aggregator import (
    bearer,
    make_settings,
    operator_headers,
    random_update,
    register,
    service_of,
    sqlite_url,
    upload_headers,
)
from services.aggregator.app import create_app
from services.aggregator.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "run_retention.json"
N_ITEMS = 2071  # FilmTrust's catalogue
CLIENTS = 40
#: "without retention": more runs kept than the bench starts
UNBOUNDED = 1000


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def _cycle(client: TestClient, token: str, run: dict[str, Any], rng: np.random.Generator) -> None:
    r = client.post("/v1/runs", json=run, headers=operator_headers())
    assert r.status_code == 201, r.text
    cfg = RunConfig.model_validate(run).model()
    for _ in range(int(run["rounds"])):
        cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
        round_id = int(cur["round_id"])
        for c in cur["cohort"]:
            body = encode_updates(round_id, [random_update(cfg, c, rng, n_rows=60)])
            r = client.post(
                f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token)
            )
            assert r.status_code == 200, r.text
    client.post("/v1/runs/current/stop", headers=operator_headers())
    service = service_of(client)
    service.storage.free()
    service.storage.compactor.run()


def main(runs: Positive = 20, rounds: Positive = 3, out: OutFile = RESULTS) -> None:
    keep_default = Settings.model_fields["keep_runs"].default
    run = {"n_items": N_ITEMS, "rounds": rounds + 1, "fraction": 0.25, "seed": 0}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedrec-retention-") as tmp:
        sides: dict[str, tuple[TestClient, str, Path]] = {}
        for name, keep in (("retention", keep_default), ("no retention", UNBOUNDED)):
            folder = Path(tmp) / name.replace(" ", "-")
            folder.mkdir()
            db = folder / "aggregator.db"
            settings = make_settings(sqlite_url(folder), keep_runs=keep)
            client = TestClient(create_app(settings))
            client.__enter__()
            sides[name] = (client, register(client, list(range(CLIENTS))), db)
        series: dict[str, list[int]] = {name: [] for name in sides}
        try:
            for i in range(runs):
                for name, (client, token, db) in sides.items():
                    _cycle(client, token, run, np.random.default_rng(i))
                    series[name].append(_bytes(db))
                print(
                    f"run {i + 1}: "
                    + ", ".join(f"{n} {s[-1] / 1e6:.1f} MB" for n, s in series.items())
                )
        finally:
            for client, _, _ in sides.values():
                client.__exit__(None, None, None)
    keep = min(keep_default, runs)
    result = {
        "runs": runs,
        "rounds_per_run": rounds,
        "keep_runs": keep_default,
        "model": RunConfig.model_validate(run).model_dump(include={"n_items", "factor", "layers"}),
        "clients": CLIENTS,
        "bytes": series,
        # after the first keep_runs runs, with retention the size stays at its value then
        "growth_after_keep_runs": {name: s[-1] / s[keep - 1] - 1.0 for name, s in series.items()},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
