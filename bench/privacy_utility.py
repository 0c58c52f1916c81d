"""Privacy-utility of client-level DP: HR@10 / NDCG@10 at several target epsilons.

For each dataset, target epsilon and seed, a simulated FedRecGEL run with Poisson cohort
sampling (q = fraction) and central DP: the accountant calibrates the noise multiplier so that
the run's rounds spend exactly the target (delta = 1 / number of users), each upload clipped to
``--clip``. The same runs without DP (same sampling, no clipping, no noise) are the reference.
Test figures are taken at the validation-selected round.

    nice -n 5 .venv/bin/python -m bench.privacy_utility --datasets filmtrust --rounds 4
    nice -n 5 .venv/bin/python -m bench.privacy_utility --datasets filmtrust --rounds 50 \
        --eval-every 10 --optimizer sgd --server-lr 3 --seeds 1,2,3
    nice -n 5 .venv/bin/python -m bench.privacy_utility --datasets filmtrust --rounds 50 \
        --eval-every 10 --optimizer sgd --server-lr 1.2 --server-momentum 0.9 \
        --clip 0.25 --seeds 1,2,3
    .venv/bin/python -m bench.privacy_utility --plot      # docs/privacy_utility.png

Each dataset and training setting (server optimizer, step size, rounds) is its own entry.
Resumable: each finished run is written to bench/results/privacy_utility.json at once and
skipped when the script is started again with the same settings.
"""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import numpy as np

from bench.bench_cli import Positive, default_data_dir, opt, validation_split
from fedrecgel.config import DEFAULTS, current_names
from fedrecgel.simulate import Simulator, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "privacy_utility.json"
PLOT = ROOT / "docs" / "privacy_utility.png"


def _run(split: Any, cfg: TrainConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    sim = Simulator(split, cfg)
    res = sim.run()
    sel = res.selected() or {}
    plan = sim.privacy
    return {
        "selected_round": sel.get("round"),
        "hr@10": sel.get("hr@10"),
        "ndcg@10": sel.get("ndcg@10"),
        "noise_multiplier": None if plan is None else plan.noise,
        "epsilon": None if plan is None else plan.epsilon(len(res.rounds)),
        "delta": None if plan is None else plan.delta,
        "rounds": len(res.rounds),
        "seconds": time.perf_counter() - t0,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(runs)}
    for key in ("hr@10", "ndcg@10", "noise_multiplier", "epsilon", "seconds"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[f"{key}.mean"] = float(np.mean(vals))
            out[f"{key}.std"] = float(np.std(vals))
    return out


def _store(key_of_entry: str, fresh: dict[str, Any], run_key: str, run: dict[str, Any]) -> None:
    """Add one finished run to the JSON under a file lock (several processes may measure
    different seeds of one entry at once), and recompute the entry's summary."""
    with open(OUT.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
        entry = data.get(key_of_entry)
        if entry is None or entry.get("settings") != fresh["settings"]:
            entry = fresh
        entry["runs"][run_key] = run
        by_target: dict[str, list[dict[str, Any]]] = {}
        for k, r in entry["runs"].items():
            by_target.setdefault(k.split("/")[0], []).append(r)
        entry["summary"] = {t: _summary(rs) for t, rs in by_target.items()}
        data[key_of_entry] = entry
        OUT.write_text(json.dumps(data, indent=1) + "\n")


def measure(args: SimpleNamespace) -> None:
    settings = {
        "rounds": args.rounds,
        "fraction": args.fraction,
        "clip": args.clip,
        "eval_every": args.eval_every,
        "sampling": "poisson",
        "mode": "central",
        "validation": True,
        "optimizer": args.optimizer,
        "server_lr": args.server_lr,
    }
    if args.server_momentum:  # (absent from the entries measured before it was an option)
        settings["server_momentum"] = args.server_momentum
    seeds = [int(s) for s in args.seeds.split(",")]
    targets = ["none", *args.epsilons.split(",")]
    for name in args.datasets.split(","):
        split = validation_split(name, args.data_dir)  # lastfm-2k/clean: a protocol named
        key_of_entry = entry_key(name, settings)
        fresh = {"dataset": name, "settings": settings, "n_users": split.n_users, "runs": {}}
        for seed in seeds:  # every target of a seed first: partial results cover the curve
            for target in targets:
                key = f"{target}/{seed}"
                data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
                done = data.get(key_of_entry, {})
                if current_names(done.get("settings", {})) == settings and key in done.get(
                    "runs", {}
                ):
                    continue
                cfg = TrainConfig(
                    rounds=args.rounds,
                    fraction=args.fraction,
                    eval_every=args.eval_every,
                    sampling="poisson",
                    seed=seed,
                    optimizer=args.optimizer,
                    server_lr=args.server_lr,
                    server_momentum=args.server_momentum,
                    dp_clip=args.clip,
                    # clipping needs each client's upload: built in groups of clients (the
                    # same uploads up to float rounding, faster)
                    grouped_uploads=True,
                    target_epsilon=None if target == "none" else float(target),
                )
                run = _run(split, cfg)
                _store(key_of_entry, fresh, key, run)
                print(name, key, json.dumps(run), flush=True)


def entry_key(name: str, settings: dict[str, Any]) -> str:
    """One entry per dataset and training setting: ``filmtrust sgd 3, 50 rounds``."""
    momentum = settings.get("server_momentum")
    how = f" momentum {momentum:g} clip {settings['clip']:g}" if momentum else ""
    return f"{name} {settings['optimizer']} {settings['server_lr']:g}{how}, {settings['rounds']} rounds"


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(OUT.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, metric in zip(axes, ("hr@10", "ndcg@10"), strict=True):
        for name, entry in data.items():
            summ = entry.get("summary", {})
            eps = sorted(float(t) for t in summ if t != "none")
            if not eps:
                continue
            ys = [summ[_key(summ, e)][f"{metric}.mean"] for e in eps]
            es = [summ[_key(summ, e)][f"{metric}.std"] for e in eps]
            line = ax.errorbar(eps, ys, yerr=es, marker="o", capsize=3, label=f"{name}, DP")
            if "none" in summ:
                ax.axhline(
                    summ["none"][f"{metric}.mean"],
                    ls="--",
                    color=line[0].get_color(),
                    label=f"{name}, no DP",
                )
        ticks: set[float] = set()
        for entry in data.values():
            ticks |= {float(t) for t in entry.get("summary", {}) if t != "none"}
        for name in sorted({e.get("dataset", k) for k, e in data.items()}):
            ref = _popularity(name, metric)
            if ref is not None:
                ax.axhline(ref, ls=":", color="grey", label=f"{name}, popularity ranking")
        ax.set_xscale("log")
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
        ax.set_xlabel("epsilon (delta = 1/users)")
        ax.set_ylabel(f"test {metric.upper()} (validation-selected)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Client-level DP (central, Poisson sampling): privacy-utility", fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    print(f"wrote {PLOT}")


def _popularity(dataset: str, metric: str) -> float | None:
    """The popularity ranking's test figure on the paper protocol (bench/results/baselines.json)."""
    path = ROOT / "bench" / "results" / "baselines.json"
    if not path.exists():
        return None
    entry = json.loads(path.read_text()).get(f"{dataset}/paper", {}).get("popularity", {})
    value = entry.get(f"selected.{metric}.mean")
    return None if value is None else float(value)


def _key(summ: dict[str, Any], eps: float) -> str:
    return next(t for t in summ if t != "none" and float(t) == eps)


def main(
    datasets: Annotated[
        str, opt("comma-separated; NAME/PROTOCOL for another protocol (lastfm-2k/clean)")
    ] = "filmtrust,amazon-video",
    data_dir: Path | None = default_data_dir(),
    epsilons: str = "1,3,8",
    seeds: str = "0,1,2",
    rounds: Positive = 4,
    eval_every: int = 2,
    fraction: float = DEFAULTS.fraction,
    clip: float = 1.0,
    optimizer: str = DEFAULTS.optimizer,
    server_lr: float = DEFAULTS.server_lr,
    server_momentum: float = DEFAULTS.server_momentum,
    plot_only: Annotated[bool, opt("Only draw the plot from the JSON.", "--plot")] = False,
) -> None:
    args = SimpleNamespace(**locals())
    if args.plot_only:
        plot()
    else:
        measure(args)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
