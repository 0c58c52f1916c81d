"""Seconds per simulator round against clients per round and against catalogue size.

    .venv/bin/python -m bench.scaling [--max-clients 100000] [--max-items 1000000]

Synthetic data (:func:`fedrecgel.synthetic.synthetic_split`), the default client path and
model, no evaluation. Each point runs in its own child process; the timed round's clients
have their private state created beforehand (first participation costs a keyed draw per
user, measured apart as ``first_join_seconds``). Two sweeps:

- clients per round 100 ... 100,000 over 200,000 users x 10,000 items (mean 8 interactions
  a user, so about 35 training samples a client);
- catalogue 1e3 ... 1e6 items, 1,000 clients per round over 10,000 users (mean 14).

Writes bench/results/scaling.json (incrementally) and docs/scaling_clients.png,
docs/scaling_items.png. The machine is shared: read the shape of the curves (time per
sample, time per item), not the absolute seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

from bench.bench_cli import OutFile, child_command, opt, positive

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "scaling.json"
DOCS = ROOT / "docs"
CLIENTS = (100, 300, 1_000, 3_000, 10_000, 30_000, 100_000)
ITEMS = (1_000, 10_000, 100_000, 1_000_000)


def child(users: int, items: int, mean: float, clients: int, rounds: int) -> dict[str, Any]:
    """One point: ``rounds`` timed rounds, median seconds and their parts."""
    import numpy as np
    import torch

    from fedrecgel.cohort import select_cohort
    from fedrecgel.simulate import Simulator, TrainConfig
    from fedrecgel.synthetic import synthetic_split

    torch.set_grad_enabled(False)
    split = synthetic_split(users, items, interactions_per_user=mean, seed=0)
    cfg = TrainConfig(fraction=clients / users, eval_every=0, rounds=rounds)
    sim = Simulator(split, cfg)
    times, joins, samples, server = [], [], [], []
    for r in range(1, rounds + 1):
        cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, r)
        t0 = time.perf_counter()
        sim.store.get(cohort)
        joins.append(time.perf_counter() - t0)
        samples.append(int(sum(len(split.user_train(int(u))) for u in cohort)) * 5)
        apply = sim.strategy.apply
        spent = [0.0]

        def timed_apply(
            params: dict[str, torch.Tensor],
            grads: dict[str, torch.Tensor],
            rows: dict[str, torch.Tensor] | None = None,
            *,
            apply: Callable[..., None] = apply,
            spent: list[float] = spent,
        ) -> None:
            t = time.perf_counter()
            apply(params, grads, rows)
            spent[0] += time.perf_counter() - t

        sim.strategy.apply = timed_apply  # type: ignore[method-assign]
        t0 = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - t0)
        server.append(spent[0])
        sim.strategy.apply = apply  # type: ignore[method-assign]
    k = int(np.argsort(times)[len(times) // 2])
    return {
        "users": users,
        "items": items,
        "clients": len(cohort),
        "samples": samples[k],
        "seconds_per_round": times[k],
        "server_step_seconds": server[k],
        "first_join_seconds": joins[k],
        "seconds_per_round_all": times,
    }


def _point(args: SimpleNamespace, users: int, items: int, mean: float, clients: int) -> Any:
    rounds = 1 if clients >= 30_000 else args.rounds
    cmd = [*child_command(__file__), "--child", f"{users},{items},{mean},{clients},{rounds}"]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=args.point_timeout
        )
    except subprocess.TimeoutExpired:
        return {
            "users": users,
            "items": items,
            "clients": clients,
            "error": f"capped: not done within {args.point_timeout:.0f} s (data, set-up and rounds)",
            "capped_s": args.point_timeout,
        }
    if proc.returncode != 0:
        return {"users": users, "items": items, "clients": clients, "error": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plot(results: dict[str, Any]) -> None:
    """The two curves as PNGs in docs/ (log-log, with a linear reference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, xkey, xlabel, name in (
        ("clients", "clients", "clients per round", "scaling_clients.png"),
        ("items", "items", "catalogue size (items)", "scaling_items.png"),
    ):
        pts = [p for p in results.get(key, []) if "error" not in p]
        if not pts:
            continue
        x = [p[xkey] for p in pts]
        y = [p["seconds_per_round"] for p in pts]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.loglog(x, y, "o-", label="seconds per round")
        ax.loglog(x, [p["server_step_seconds"] for p in pts], "s--", label="server step")
        ax.loglog(x, [y[0] * xi / x[0] for xi in x], ":", color="grey", label="linear from first")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        ax.set_title(f"simulator round vs {xlabel} (synthetic)")
        fig.tight_layout()
        fig.savefig(DOCS / name, dpi=100)
        plt.close(fig)


def main(
    max_clients: int = CLIENTS[-1],
    max_items: int = ITEMS[-1],
    rounds: Annotated[int, opt("timed rounds per point (1 from 30k)", parser=positive)] = 2,
    point_timeout: Annotated[
        float,
        opt(
            "seconds a point may take (data, set-up and rounds); a point over it is "
            "reported as capped and the larger points of its sweep are skipped"
        ),
    ] = 600.0,
    as_child: Annotated[str | None, opt(None, "--child", hidden=True)] = None,
    plot_only: bool = False,
    out: OutFile = OUT,
) -> None:
    """Run both sweeps (children), write the JSON as points arrive, then the plots."""
    args = SimpleNamespace(**locals())
    if as_child:
        u, i, m, c, r = as_child.split(",")
        print(json.dumps(child(int(u), int(i), float(m), int(c), int(r))))
        return
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    if not args.plot_only:
        results = {"command": " ".join(["python -m bench.scaling", *sys.argv[1:]])}
        sweeps = (
            ("clients", [(200_000, 10_000, 8.0, c) for c in CLIENTS if c <= args.max_clients]),
            ("items", [(10_000, i, 14.0, 1_000) for i in ITEMS if i <= args.max_items]),
        )
        for sweep, points in sweeps:
            results[sweep] = []
            for users, items, mean, clients in points:
                results[sweep].append(_point(args, users, items, mean, clients))
                print(json.dumps(results[sweep][-1]), flush=True)
                args.out.write_text(json.dumps(results, indent=1))
                if "capped_s" in results[sweep][-1]:
                    break
    plot(results)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
