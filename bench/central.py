"""The centralized upper bound: the same NCF trained in one place on the same validation split.

    nice -n 5 .venv/bin/python -m bench.central [--only filmtrust/paper,...] \
        [--lr-grid 0.001,0.003] [--seeds 0,1,2] [--epochs N] [--threads 1]

For every dataset (FilmTrust, Amazon-Video, Lastfm-2K under the paper and the clean protocol,
and a synthetic set) the Adam step size is chosen on **validation only**: one run per step size
of ``--lr-grid`` on the tuning seed (100) on a split whose test candidates are replaced by the
validation ones (:func:`fedrecgel.tune.validation_only`, so no test figure is computed); the
step size with the best validation HR@10 wins. Then the reported seeds (0, 1, 2) train at that
step size for ``--epochs`` epochs (default: as many as the tuning runs; a smaller number just past
the tuning run's best validation epoch saves time); the epoch is chosen per seed on validation
HR@10 (``selected``), and the best test epoch is reported beside it (``best_test``, the
optimistic figure).

Resumable and parallel: every finished run is kept in ``bench/results/central.json`` (``runs``,
updated under a file lock, so one process per seed may run at once) and not run again; the
per-dataset summary (``datasets``) is rebuilt at the end. Torch runs on one thread by default:
on a shared, loaded 2-core machine two threads were ten times slower per step than one.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench.accuracy_diagnosis import load
from bench.bench_cli import FloatList, Floats, Ints, default_data_dir, int_list, opt
from fedrecgel.baselines import CentralConfig, central
from fedrecgel.data import Split, load_split
from fedrecgel.data.protocol import Protocol
from fedrecgel.model import ModelConfig
from fedrecgel.tune import validation_only

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "central.json"
TUNE_SEED = 100
SEEDS = (0, 1, 2)
LR_GRID = (0.001, 0.003)
BATCH = 1024


def _loaders(data_dir: Path | None) -> dict[str, tuple[Callable[[], Split], int]]:
    """Dataset key -> (split loader, epochs)."""

    def real(name: str, protocol: Protocol) -> Callable[[], Split]:
        return lambda: load_split(name, data_dir, validation=True, protocol=protocol)

    return {
        "filmtrust/paper": (real("filmtrust", "paper"), 20),
        "synthetic/paper": (lambda: load("synthetic", data_dir), 20),
        "amazon-video/paper": (real("amazon-video", "paper"), 8),
        "lastfm-2k/clean": (real("lastfm-2k", "clean"), 8),
        "lastfm-2k/paper": (real("lastfm-2k", "paper"), 8),
        "synthetic-holdout/paper": (lambda: load("synthetic-holdout", data_dir), 8),
        "synthetic-tastes/paper": (lambda: load("synthetic-tastes", data_dir), 20),
    }


def _run(split: Split, lr: float, seed: int, epochs: int) -> dict[str, Any]:
    """One training run, summarised: validation curve, test curve, the two headline picks."""
    cfg = CentralConfig(
        ModelConfig(n_items=split.n_items), epochs=epochs, lr=lr, batch_size=BATCH, seed=seed
    )

    def show(rec: Any) -> None:
        val = rec.val.get("hr@10", rec.test.get("hr@10", float("nan")))
        print(
            f"  lr={lr} seed={seed} epoch {rec.round}: loss {rec.loss:.4f} "
            f"val-or-test hr@10 {val:.4f} ({rec.seconds:.0f} s)",
            flush=True,
        )

    res = central(split, cfg, on_epoch=show)
    out: dict[str, Any] = {
        "lr": lr,
        "seed": seed,
        "epochs": epochs,
        "seconds": res.wall_seconds,
        "loss": [r.loss for r in res.rounds],
        "test_hr@10": [r.test.get("hr@10") for r in res.rounds],
        "test_ndcg@10": [r.test.get("ndcg@10") for r in res.rounds],
        "val_hr@10": [r.val.get("hr@10") for r in res.rounds],
    }
    sel, best = res.selected(), res.best_test()
    if sel is not None:
        val_at = next(r.val["hr@10"] for r in res.rounds if r.round == sel["round"])
        out["selected"] = {
            "epoch": sel["round"],
            "hr@10": sel["hr@10"],
            "ndcg@10": sel["ndcg@10"],
            "val_hr@10": val_at,
        }
    if best is not None:
        out["best_test"] = {
            "epoch": best["round"],
            "hr@10": best["hr@10"],
            "ndcg@10": best["ndcg@10"],
        }
    return out


def _stats(vals: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals))}


def _summary(key: str, epochs: int, lrs: list[float], runs: dict[str, Any]) -> dict[str, Any]:
    """The dataset's figures from the finished runs: the step size with the best validation
    HR@10 on the tuning seed, then mean / std over the reported seeds run at it."""
    lr_val = {
        lr: max(v for v in runs[f"{key}|tune|lr={lr}"]["test_hr@10"] if v is not None) for lr in lrs
    }
    lr = max(lrs, key=lambda x: lr_val[x])
    done = [runs[n] for s in SEEDS if (n := f"{key}|seed={s}|lr={lr}") in runs]
    out: dict[str, Any] = {
        "lr": lr,
        "epochs": epochs,
        "batch_size": BATCH,
        "tune_seed": TUNE_SEED,
        "lr_grid": {str(k): v for k, v in lr_val.items()},
        "seeds": [r["seed"] for r in done],
        "complete": len(done) == len(SEEDS),
        "tune_epochs": runs[f"{key}|tune|lr={lr}"]["epochs"],
        "per_seed": [
            {k: r[k] for k in ("seed", "epochs", "selected", "best_test", "seconds")} for r in done
        ],
    }
    for pick in ("selected", "best_test"):
        if done:
            out[pick] = {m: _stats([r[pick][m] for r in done]) for m in ("hr@10", "ndcg@10")}
    return out


def _update(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read, change and write the results file under a lock (several processes may share it)."""
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
        results.setdefault("runs", {})
        results.setdefault("datasets", {})
        change(results)
        tmp = OUT.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, OUT)
        return results


def _put_run(name: str, run: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A change for :func:`_update`: store ``run`` under ``name``."""

    def put(results: dict[str, Any]) -> None:
        results["runs"][name] = run

    return put


def main(
    data_dir: Path | None = default_data_dir(),
    only: Annotated[str, opt("comma-separated dataset keys (default: all)")] = "",
    lr_grid: FloatList = Floats(list(LR_GRID)),
    seeds: Annotated[Ints, opt("of 0,1,2 to run", parser=int_list, metavar="INTS")] = Ints(
        list(SEEDS)
    ),
    reported_epochs: Annotated[
        int,
        opt(
            "epochs of the reported seeds (default: the tuning runs'; e.g. just past the "
            "tuning run's best validation epoch)",
            "--epochs",
        ),
    ] = 0,
    threads: int = 1,
) -> None:
    torch.set_num_threads(threads)
    loaders = _loaders(data_dir)
    keys = [k for k in only.split(",") if k] or list(loaders)
    unknown = [k for k in keys if k not in loaders]
    if unknown:
        raise SystemExit(f"unknown dataset keys {unknown}; known: {sorted(loaders)}")
    for key in keys:
        load, epochs = loaders[key]
        split = load()
        print(f"{key}: {split.n_users} users, {split.n_items} items, {split.n_train} rows")
        tuning = validation_only(split)
        for lr in lr_grid:
            name = f"{key}|tune|lr={lr}"
            if name not in _update(lambda r: None)["runs"]:
                run = _run(tuning, lr, TUNE_SEED, epochs)
                _update(_put_run(name, run))
        lr = _summary(key, epochs, lr_grid, _update(lambda r: None)["runs"])["lr"]
        for seed in seeds:
            name = f"{key}|seed={seed}|lr={lr}"
            if name not in _update(lambda r: None)["runs"]:
                run = _run(split, lr, seed, reported_epochs or epochs)
                _update(_put_run(name, run))

        def summarise(r: dict[str, Any], key: str = key, epochs: int = epochs) -> None:
            r["datasets"][key] = _summary(key, reported_epochs or epochs, lr_grid, r["runs"])

        s = _update(summarise)["datasets"][key]
        print(key, "lr", s["lr"], "selected", s.get("selected"), flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
