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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench.bench_cli import Ints, default_data_dir, int_list, opt
from fedrecgel.cohort import select_cohort
from fedrecgel.data import load_split
from fedrecgel.model import ModelConfig
from fedrecgel.sam import negative_pool
from fedrecgel.secagg import shamir
from fedrecgel.secagg.aggregate import (
    counting_ring,
    counts_spec,
    item_indicator,
    round_spec,
    row_gain,
    sparse_fixed_point,
    sparse_input,
    update_spec,
)
from fedrecgel.secagg.layout import flatten
from fedrecgel.secagg.protocol import Client, RoundSpec
from fedrecgel.secagg.server import Outcome, Server
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import aggregate_gradients
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_updates, encode_updates

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "secagg_cost.json"


@dataclass
class Timed:
    """One protocol round run client by client: mean bytes up/down and seconds per client, the
    server's seconds per client, and its outcome."""

    up: float
    down: float
    client_s: float
    server_s: float
    outcome: Outcome


def timed_round(spec: RoundSpec, x: Callable[[int], np.ndarray]) -> Timed:
    """A whole round over ``spec``'s cohort (inputs ``x(client)``), every message counted."""
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
        m = timed(u, lambda u=u, got=got: clients[u].masked(x(u), got))
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
    n = len(spec.cohort)
    return Timed(
        float(np.mean(list(up.values()))),
        float(np.mean(list(down.values()))),
        float(np.mean(list(client_s.values()))),
        server_s / n,
        outcome,
    )


def plain_cost(cfg: ModelConfig, uploads: list[Update]) -> dict[str, float]:
    """Today's plain sparse uploads of ``uploads``: bytes, client encode and server decode +
    mean seconds, per client."""
    t0 = time.perf_counter()
    bodies = [encode_updates(1, [u]) for u in uploads]
    client_s = (time.perf_counter() - t0) / len(uploads)
    t0 = time.perf_counter()
    decoded = [decode_updates(b, cfg).updates[0] for b in bodies]
    aggregate_gradients(decoded, cfg.shared_shapes(), "mean")
    server_s = (time.perf_counter() - t0) / len(uploads)
    return {
        "upload_bytes_per_client": float(np.mean([len(b) for b in bodies])),
        "client_s_per_client": client_s,
        "server_s_per_client": server_s,
    }


def _round_one(
    name: str, data_dir: Path | None, n_clients: int, config: TrainConfig
) -> tuple[Simulator, np.ndarray, np.ndarray, list[Update], float]:
    """Round 1 of a run of ``config`` on ``name``: the simulator, the full cohort, its first
    ``n_clients``, their uploads and the client step's seconds per client."""
    split = load_split(name, None if name == "filmtrust" else data_dir)
    sim = Simulator(split, config)
    full = select_cohort(sim.users, config.fraction, config.seed, 1)
    cohort = full[:n_clients]
    t0 = time.perf_counter()
    uploads = sim.clients.step(
        sim.shared, 1, cohort, split.user_train, sim.store.get(cohort)
    ).uploads
    return sim, full, cohort, uploads, (time.perf_counter() - t0) / len(cohort)


def measure(name: str, data_dir: Path | None, n_clients: int) -> dict[str, Any]:
    config = TrainConfig(rounds=1, secure_aggregation="dense", eval_every=0)
    sim, full, cohort, uploads, train_s = _round_one(name, data_dir, n_clients, config)
    cfg = sim.model_cfg

    # (a) plain sparse uploads
    plain = plain_cost(cfg, uploads)
    plain_up, plain_client_s, plain_server_s = (
        plain["upload_bytes_per_client"],
        plain["client_s_per_client"],
        plain["server_s_per_client"],
    )

    # (b) secure aggregation
    spec = round_spec(cfg, sim.params, 1, [int(c) for c in cohort])
    by_id = {u.client_id: u for u in uploads}
    sec = timed_round(spec, lambda u: flatten(cfg, by_id[u]))
    outcome = sec.outcome
    # the secure sum is the plain sum (a benchmark that measured a wrong round is worthless)
    plain_sum = sum(flatten(cfg, u) for u in uploads)
    max_err = float(np.abs(outcome.total - plain_sum).max())
    assert max_err <= len(cohort) * spec.fixed.step, max_err
    sec_up, sec_down, sec_client = sec.up, sec.down, sec.client_s
    sec_server = sec.server_s
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
        "plain": plain,
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


def measure_sparse(name: str, data_dir: Path | None, n_clients: int, pool: int) -> dict[str, Any]:
    """``secure_aggregation=sparse`` with ``negative_pool=pool`` against plain uploads with
    the same pool: the first ``n_clients`` of round 1's cohort go through both instances; the
    rings and the union U are those of the full cohort (U: its positives outside the pool, what
    A reveals over it, plus the pool), so the per-client figures are the full round's."""
    config = TrainConfig(rounds=1, secure_aggregation="sparse", negative_pool=pool, eval_every=0)
    sim, full, cohort, uploads, train_s = _round_one(name, data_dir, n_clients, config)
    cfg, params, split = sim.model_cfg, sim.params, sim.split
    plain = plain_cost(cfg, uploads)
    items = negative_pool(params.seed, 1, cfg.n_items, pool)
    counts = np.zeros(cfg.n_items, dtype=np.int64)
    for u in full.tolist():
        counts[np.setdiff1d(split.user_train(u), items)] += 1
    union = np.union1d(np.flatnonzero(counts), items)
    by_id = {u.client_id: u for u in uploads}
    ids = [int(c) for c in cohort]
    spec_a = replace(counts_spec(cfg, params, 1, ids), fixed=counting_ring(len(full)))
    a = timed_round(spec_a, lambda u: item_indicator(cfg, by_id[u], items))
    spec_b = update_spec(cfg, params, 1, a.outcome.survivors, union)
    spec_b = replace(spec_b, fixed=sparse_fixed_point(params, len(full)))
    b = timed_round(spec_b, lambda u: sparse_input(cfg, params, by_id[u], union))
    # both sums are the plain ones (a benchmark that measured a wrong round is worthless)
    want_a = sum(item_indicator(cfg, u, items) for u in uploads)
    assert np.array_equal(a.outcome.total, want_a)
    got_b = b.outcome.total / row_gain(cfg, union)
    max_err = float(np.abs(got_b - sum(flatten(cfg, u, union) for u in uploads)).max())
    assert max_err <= len(cohort) * spec_b.fixed.step, max_err
    up, down = a.up + b.up, a.down + b.down
    client_s, server_s = a.client_s + b.client_s, a.server_s + b.server_s
    n_full = len(full)
    return {
        "dataset": name,
        "negative_pool": pool,
        "n_items": cfg.n_items,
        "union_rows": len(union),
        "union_share_of_items": len(union) / cfg.n_items,
        "counts_words": f"uint{spec_a.fixed.word_bits}",
        "update_words": f"uint{spec_b.fixed.word_bits}",
        "update_scale_bits": spec_b.fixed.scale_bits,
        "counts_length": spec_a.length,
        "update_length": spec_b.length,
        "clients_measured": len(cohort),
        "full_cohort": n_full,
        "max_abs_error_of_sum": max_err,
        "train_step_s_per_client": train_s,
        "plain_same_pool": plain,
        "sparse": {
            "upload_bytes_per_client": up,
            "upload_bytes_counts": a.up,
            "upload_bytes_update": b.up,
            "download_bytes_per_client": down,
            "client_s_per_client": client_s,
            "server_s_per_client": server_s,
        },
        "ratio": {
            "upload_bytes": up / plain["upload_bytes_per_client"],
            "client_s": client_s / plain["client_s_per_client"],
            "server_s": server_s / plain["server_s_per_client"],
            "client_s_vs_train_step": client_s / train_s,
        },
        "per_round_full_cohort": {
            "plain_upload_mb": plain["upload_bytes_per_client"] * n_full / 1e6,
            "sparse_upload_mb": up * n_full / 1e6,
        },
    }


def main(
    datasets: str = "filmtrust,amazon-video",
    clients: int = 24,
    data_dir: Path | None = default_data_dir(),
    pools: Annotated[
        Ints,
        opt(
            "measure secure_aggregation=sparse at these negative_pool sizes instead of dense",
            parser=int_list,
            metavar="INTEGERS",
        ),
    ] = Ints([]),
) -> None:
    torch.set_num_threads(1)
    out: dict[str, Any] = {"datasets": {}}
    if OUT.exists():
        out = json.loads(OUT.read_text())
    for name in datasets.split(","):
        if pools:
            for pool in pools:
                got = measure_sparse(name, data_dir, clients, pool)
                out.setdefault("sparse", {}).setdefault(name, {})[str(pool)] = got
                OUT.write_text(json.dumps(out, indent=2) + "\n")
                print(json.dumps({"pool": pool, **got["ratio"]}), flush=True)
            continue
        out["datasets"][name] = measure(name, data_dir, clients)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["datasets"][name]["ratio"]), flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
