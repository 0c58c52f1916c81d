"""What secure aggregation costs per round against today's plain sparse uploads.

    nice -n 5 .venv/bin/python -m bench.secagg_cost [--datasets filmtrust,amazon-video]
        [--clients 24] [--data-dir ../shared/datasets]

For each dataset, the clients of round 1's cohort (the first ``--clients`` of it; the default
run settings, secure_aggregation=dense with their SecAgg+ neighbourhood) take one client step;
then the same uploads go (a) as today's plain sparse safetensors bodies (client encodes, server
decodes and averages) and (b) through a secure-aggregation round (advertise, share, flatten +
fixed-point + mask, reveal; server routes, sums and unmasks). Bytes are exact message sizes;
seconds are measured here, one client after another, in the same run, so the ratios are what
to read (the machine is shared and absolute times drift). A client's secure-aggregation cost
depends on its neighbourhood's size, not on the cohort's, so the per-client figures hold for
the full cohort; the per-round figures multiply them by the full cohort's size and say so.
Writes bench/results/secagg_cost.json (partial results after each dataset).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.bench_cli import default_data_dir
from fedrecgel.cohort import select_cohort
from fedrecgel.data import load_split
from fedrecgel.secagg import shamir
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.layout import flatten
from fedrecgel.secagg.protocol import Client
from fedrecgel.secagg.server import Server
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import aggregate_gradients
from fedrecgel.wire import decode_updates, encode_updates

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "secagg_cost.json"


def measure(name: str, data_dir: Path | None, n_clients: int) -> dict[str, Any]:
    split = load_split(name, None if name == "filmtrust" else data_dir)
    config = TrainConfig(rounds=1, secure_aggregation="dense", eval_every=0)
    sim = Simulator(split, config)
    cfg = sim.model_cfg
    full = select_cohort(sim.users, config.fraction, config.seed, 1)
    cohort = full[:n_clients]
    t0 = time.perf_counter()
    uploads = sim.clients.step(
        sim.shared, 1, cohort, split.user_train, sim.store.get(cohort)
    ).uploads
    train_s = (time.perf_counter() - t0) / len(cohort)
    shapes = cfg.shared_shapes()

    # (a) plain sparse uploads
    t0 = time.perf_counter()
    bodies = [encode_updates(1, [u]) for u in uploads]
    plain_client_s = (time.perf_counter() - t0) / len(cohort)
    t0 = time.perf_counter()
    decoded = [decode_updates(b, cfg).updates[0] for b in bodies]
    aggregate_gradients(decoded, shapes, "mean")
    plain_server_s = (time.perf_counter() - t0) / len(cohort)
    plain_up = float(np.mean([len(b) for b in bodies]))

    # (b) secure aggregation
    spec = round_spec(cfg, sim.params, 1, [int(c) for c in cohort])
    by_id = {u.client_id: u for u in uploads}
    server = Server(spec)
    clients = {u: Client(spec, u) for u in spec.cohort}
    client_s = dict.fromkeys(spec.cohort, 0.0)
    server_s = 0.0
    up = dict.fromkeys(spec.cohort, 0)
    down = dict.fromkeys(spec.cohort, 0)

    def timed(u: int, f: Any, *args: Any) -> Any:
        t = time.perf_counter()
        out = f(*args)
        client_s[u] += time.perf_counter() - t
        return out

    for u in spec.cohort:
        k = timed(u, clients[u].advertise)
        up[u] += len(k.c_pk) + len(k.s_pk)
        t = time.perf_counter()
        server.add_keys(k)
        server_s += time.perf_counter() - t
    for u in spec.cohort:
        keys = server.keys_for(u)
        down[u] += 64 * len(keys)
        sh = timed(u, clients[u].share, keys)
        up[u] += sum(len(c) for c in sh.sealed.values()) + 64 * len(sh.share_commits) + 32
        t = time.perf_counter()
        server.add_shares(sh)
        server_s += time.perf_counter() - t
    for u in spec.cohort:
        got = server.shares_for(u)
        down[u] += sum(len(m.sealed[u]) + 64 for m in got.values())
        m = timed(u, lambda u=u, got=got: clients[u].masked(flatten(cfg, by_id[u]), got))
        up[u] += m.y.nbytes
        t = time.perf_counter()
        server.add_masked(m)
        server_s += time.perf_counter() - t
    alive, gone = server.survivors()
    reveals = []
    for u in alive:
        rv = timed(u, clients[u].reveal, alive, gone)
        up[u] += shamir.SHARE_BYTES * (len(rv.b_shares) + len(rv.s_shares))
        reveals.append(rv)
    t = time.perf_counter()
    outcome = server.unmask(reveals)
    server_s += time.perf_counter() - t
    # the secure sum is the plain sum (a benchmark that measured a wrong round is worthless)
    plain_sum = sum(flatten(cfg, u) for u in uploads)
    max_err = float(np.abs(outcome.total - plain_sum).max())
    assert max_err <= len(cohort) * spec.fixed.step, max_err
    sec_up = float(np.mean(list(up.values())))
    sec_down = float(np.mean(list(down.values())))
    sec_client = float(np.mean(list(client_s.values())))
    sec_server = server_s / len(cohort)
    n_full = len(full)
    return {
        "dataset": name,
        "n_items": cfg.n_items,
        "vector_length": spec.length,
        "clients_measured": len(cohort),
        "full_cohort": n_full,
        "neighbours_each_side": spec.neighbours,
        "degree": len(spec.neighbours_of(spec.cohort[0])),
        "threshold": spec.threshold(spec.cohort[0]),
        "max_abs_error_of_sum": max_err,
        "train_step_s_per_client": train_s,
        "plain": {
            "upload_bytes_per_client": plain_up,
            "client_s_per_client": plain_client_s,
            "server_s_per_client": plain_server_s,
        },
        "secagg": {
            "upload_bytes_per_client": sec_up,
            "download_bytes_per_client": sec_down,
            "client_s_per_client": sec_client,
            "server_s_per_client": sec_server,
        },
        "ratio": {
            "upload_bytes": sec_up / plain_up,
            "client_s": sec_client / plain_client_s,
            "server_s": sec_server / plain_server_s,
            "client_s_vs_train_step": sec_client / train_s,
        },
        "per_round_full_cohort": {
            "plain_upload_mb": plain_up * n_full / 1e6,
            "secagg_upload_mb": sec_up * n_full / 1e6,
            "secagg_download_mb": sec_down * n_full / 1e6,
        },
    }


def main(
    datasets: str = "filmtrust,amazon-video",
    clients: int = 24,
    data_dir: Path | None = default_data_dir(),
) -> None:
    torch.set_num_threads(1)
    out: dict[str, Any] = {"datasets": {}}
    if OUT.exists():
        out = json.loads(OUT.read_text())
    for name in datasets.split(","):
        out["datasets"][name] = measure(name, data_dir, clients)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["datasets"][name]["ratio"]), flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
