"""The ray backend on a local Ray cluster of 1, 2 and 3 nodes against the in-process simulator
at the same shards, in the same run: seconds per round, where the round's time goes, memory
per node, bytes moved per round.

Each node is a raylet of :class:`ray.cluster_utils.Cluster` on this machine with one CPU (one
shard actor each: shards = nodes); the head node offers no CPU and hosts the driver. Workloads:

* ``filmtrust``: every user of the split (1,227) every round (fraction 1), 4 rounds;
* ``synthetic-10k``: 1e6 users x 1e5 items (:func:`fedrecgel.synthetic.synthetic_split`, 14
  interactions a user, Zipf skew 1; as ``bench/speed.py``'s scale point), 10,000 clients a
  round, 3 rounds;
* ``synthetic-100k``: the same population, 100,000 clients a round, 1 round (in process at
  one node count only: the first).

Both sides run the shipped defaults' client settings with ``upload_grouping=worker`` and
``shards`` = nodes, no evaluation, one torch thread per shard's work: each actor has one (Ray's
default), and the in-process side one in all (so its shards run one after the other on one
core, and its final parameters must equal Ray's bit for bit; with more threads torch's
reductions may round otherwise). Every point runs in a child process of its own (its peak
memory is its own), sides interleaved per node count. Recorded per point: seconds per round (median of the timed rounds: all but the
first when there are several, else the first, which then includes every client's first-join
draw on both sides); the client step's time (in process: the shards' partial steps; on Ray:
the slowest actor's ``train`` and ``commit``, the latter writing the shard's checkpoint); the
server step; peak resident memory of the driver and of each shard actor (its node's share);
the bytes the driver put into the object store each round (the shared parameters; each node
fetches one copy) and the partial sums that came back; the data each node's object store holds
(its shard). A SHA-256 of the final shared parameters shows whether both sides ended equal
(they must). Writes ``bench/results/ray_scaling.json`` after every point;
``bench/report.py`` renders it (with a projection to N machines) into docs/RESULTS.md.

    python -m bench.ray_scaling [--nodes 1,2,3] [--workloads filmtrust,synthetic-10k,...]
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from bench.bench_cli import OutFile, child_command, fail, opt, run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ray_scaling.json"
#: workload -> (dataset, clients a round (None: every user), rounds)
WORKLOADS: dict[str, tuple[str, int | None, int]] = {
    "filmtrust": ("filmtrust", None, 4),
    "synthetic-10k": ("synthetic", 10_000, 3),
    "synthetic-100k": ("synthetic", 100_000, 1),
}
#: workloads whose in-process side runs at one node count only (its round is the shards' work
#: one after the other on one core whatever their number; a point there takes minutes)
INPROCESS_ONCE = {"synthetic-100k"}
SYNTHETIC: dict[str, Any] = {
    "n_users": 1_000_000,
    "n_items": 100_000,
    "interactions_per_user": 14.0,
    "skew": 1.0,
}
POINT_TIMEOUT_S = 1200
GIB = 1024**3


def _split(dataset: str) -> Any:
    from fedrecgel.data import load_split
    from fedrecgel.synthetic import synthetic_split

    if dataset == "synthetic":
        return synthetic_split(**SYNTHETIC, seed=0)
    return load_split(dataset)


def _config(split: Any, clients: int | None, rounds: int, shards: int) -> Any:
    from fedrecgel.simulate import TrainConfig

    fraction = 1.0 if clients is None else clients / split.n_users
    return TrainConfig(
        fraction=fraction, rounds=rounds, shards=shards, upload_grouping="worker", eval_every=0
    )


def _digest(shared: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(shared):
        h.update(k.encode())
        h.update(shared[k].contiguous().numpy().tobytes())
    return h.hexdigest()


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in ``obj`` (a partial sum, a dict, a tuple...)."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return int(obj.nelement() * obj.element_size())
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if isinstance(obj, (int, float)):
        return 8  # a client id, a sample count, a loss
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_nbytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


def _peak_rss_self() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _timed(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)

    return wrapper


def _rounds(sim: Any, rounds: int, per_round: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rec = sim.step()
        wall = time.perf_counter() - t0
        out.append({"round": rec.round, "clients": rec.n_clients, "seconds": wall, **per_round()})
    return out


def _timed_median(rows: list[dict[str, Any]], key: str) -> float:
    timed = rows[1:] if len(rows) > 1 else rows
    return float(statistics.median(r[key] for r in timed))


def child_inprocess(workload: str, nodes: int) -> dict[str, Any]:
    """One in-process point: the simulator with ``shards=nodes``."""
    import torch

    from fedrecgel.simulate import Simulator

    dataset, clients, rounds = WORKLOADS[workload]
    threads = 1
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    split = _split(dataset)
    data_s = time.perf_counter() - t0
    sim = Simulator(split, _config(split, clients, rounds, nodes))
    client: list[float] = []
    server: list[float] = []
    # (ClientRound is a frozen dataclass: its method replaced on this instance only)
    object.__setattr__(sim.clients, "partial_step", _timed(sim.clients.partial_step, client))
    sim.strategy.apply = _timed(sim.strategy.apply, server)  # type: ignore[method-assign]

    def per_round() -> dict[str, Any]:
        row = {"client_step_s": sum(client), "server_step_s": sum(server)}
        client.clear()
        server.clear()
        return row

    rows = _rounds(sim, rounds, per_round)
    return {
        "torch_threads": threads,
        "data_s": round(data_s, 2),
        "rounds": rows,
        "seconds_per_round": _timed_median(rows, "seconds"),
        "client_step_s": _timed_median(rows, "client_step_s"),
        "server_step_s": _timed_median(rows, "server_step_s"),
        "peak_rss_bytes": _peak_rss_self(),
        "final_sha256": _digest(sim.shared),
    }


def _timed_actor_class() -> Any:
    """:class:`~fedrecgel.ray_shard.ShardActor` that times its calls and reports its peak
    memory and node."""
    from fedrecgel.ray_shard import ShardActor

    class TimedShardActor(ShardActor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.spent: dict[str, list[float]] = {"train": [], "commit": []}

        def train(self, *args: Any, **kwargs: Any) -> Any:
            return _timed(super().train, self.spent["train"])(*args, **kwargs)

        def commit(self, *args: Any, **kwargs: Any) -> Any:
            return _timed(super().commit, self.spent["commit"])(*args, **kwargs)

        def stats(self) -> dict[str, Any]:
            import ray

            status = Path("/proc/self/status").read_text()
            peak = next(ln for ln in status.splitlines() if ln.startswith("VmHWM:"))
            return {
                "spent": self.spent,
                "peak_rss_bytes": int(peak.split()[1]) * 1024,
                "node": ray.get_runtime_context().get_node_id(),
            }

    return TimedShardActor


def child_ray(workload: str, nodes: int) -> dict[str, Any]:
    """One ray point: a head without CPUs and ``nodes`` one-CPU nodes, a shard actor each."""
    import ray
    from ray.cluster_utils import Cluster

    import fedrecgel.ray_backend as rb
    from fedrecgel.ray_shard import ShardData
    from fedrecgel.uploads import PartialSum

    dataset, clients, rounds = WORKLOADS[workload]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    split = _split(dataset)
    data_s = time.perf_counter() - t0
    shard_bytes = [_nbytes(ShardData.of(split, s, nodes)) for s in range(nodes)]
    store = max(2 * GIB, 2 * max(shard_bytes))  # the node's shard, the round's parameters
    t0 = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": max(2 * GIB, 2 * sum(shard_bytes)),
        },
    )
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, object_store_memory=store)
    cluster.wait_for_nodes()
    put: list[int] = []
    back: list[int] = []

    class MeasuredRaySimulator(rb.RaySimulator):
        def _each(self, shards: Iterable[int], call: Any, *args: Any, **kwargs: Any) -> Any:
            got = super()._each(shards, call, *args, **kwargs)
            if any(isinstance(v, PartialSum) for v in got.values()):
                put.append(_nbytes(self.shared))
                back.extend(_nbytes(v) for v in got.values())
            return got

    rb.ShardActor = _timed_actor_class()  # type: ignore[attr-defined]  # ray_backend's import of it
    try:
        with rb.ray_cluster(cluster.address, nodes), tempfile.TemporaryDirectory() as d:
            cluster_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            cfg = _config(split, clients, rounds, nodes)
            with MeasuredRaySimulator(split, cfg, Path(d)) as sim:
                actors_s = time.perf_counter() - t1
                server: list[float] = []
                sim.strategy.apply = _timed(sim.strategy.apply, server)  # type: ignore[method-assign]
                seen = {"train": 0, "commit": 0}

                def per_round() -> dict[str, Any]:
                    stats = ray.get([a.stats.remote() for a in sim.actors])
                    row: dict[str, Any] = {"server_step_s": sum(server)}
                    for phase in ("train", "commit"):
                        row[f"actor_{phase}_s"] = max(
                            sum(s["spent"][phase][seen[phase] :]) for s in stats
                        )
                    seen.update({p: len(stats[0]["spent"][p]) for p in seen})
                    row["put_bytes"] = sum(put)
                    row["partials_bytes"] = sum(back)
                    server.clear()
                    put.clear()
                    back.clear()
                    return row

                rows = _rounds(sim, rounds, per_round)
                stats = ray.get([a.stats.remote() for a in sim.actors])
                digest = _digest(sim.shared)
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]  # ray: unannotated
    return {
        "data_s": round(data_s, 2),
        "cluster_start_s": round(cluster_s, 2),
        "actors_start_s": round(actors_s, 2),
        "rounds": rows,
        "seconds_per_round": _timed_median(rows, "seconds"),
        "actor_train_s": _timed_median(rows, "actor_train_s"),
        "actor_commit_s": _timed_median(rows, "actor_commit_s"),
        "server_step_s": _timed_median(rows, "server_step_s"),
        "put_bytes_per_round": _timed_median(rows, "put_bytes"),
        "partials_bytes_per_round": _timed_median(rows, "partials_bytes"),
        "driver_peak_rss_bytes": _peak_rss_self(),
        "actor_peak_rss_bytes": [s["peak_rss_bytes"] for s in stats],
        "actors_on_distinct_nodes": len({s["node"] for s in stats}) == nodes,
        "shard_data_bytes": shard_bytes,
        "final_sha256": digest,
    }


def _point(workload: str, nodes: int, backend: str) -> dict[str, Any]:
    cmd = [*child_command(__file__), "--child", json.dumps([workload, nodes, backend])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as Ray sets it for its actors
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=POINT_TIMEOUT_S, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {POINT_TIMEOUT_S} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["child_wall_s"] = round(wall, 1)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


def main(
    nodes: Annotated[str, opt("node counts, comma-separated")] = "1,2,3",
    workloads: Annotated[str, opt("comma-separated")] = ",".join(WORKLOADS),
    out: OutFile = RESULTS,
    child: Annotated[str | None, opt(hidden=True)] = None,
) -> None:
    if child:
        workload, n, backend = json.loads(child)
        fn = child_ray if backend == "ray" else child_inprocess
        print(json.dumps(fn(workload, n)))
        return
    try:
        counts = [int(n) for n in nodes.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise fail(f"--nodes: positive integers, comma-separated, got {nodes!r}")
    chosen = workloads.split(",")
    if unknown := set(chosen) - set(WORKLOADS):
        raise fail(
            f"--workloads: unknown {', '.join(sorted(unknown))}; one of {', '.join(WORKLOADS)}"
        )
    from fedrecgel.ray_backend import ray_missing

    if (missing := ray_missing()) is not None:
        raise fail(missing)
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "command": "python -m bench.ray_scaling " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "python": platform.python_version(),
        },
        "synthetic": SYNTHETIC,
        "workloads": {
            w: {"dataset": d, "clients": c, "rounds": r}
            for w, (d, c, r) in WORKLOADS.items()
            if w in chosen
        },
        "points": [],
    }
    t_all = time.perf_counter()
    for workload in chosen:
        for n in counts:
            for backend in ("inprocess", "ray"):
                if backend == "inprocess" and workload in INPROCESS_ONCE and n != counts[0]:
                    continue
                point = {"workload": workload, "nodes": n, "backend": backend}
                point.update(_point(workload, n, backend))
                result["points"].append(point)
                print(json.dumps({k: point.get(k) for k in (
                    "workload", "nodes", "backend", "seconds_per_round", "child_wall_s", "error"
                )}), flush=True)  # fmt: skip
                result["total_s"] = round(time.perf_counter() - t_all, 1)
                out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    run(main)
