"""The rho_sh x rho_ns sensitivity grid of FedRecGEL (the paper's hyperparameter study).

    nice -n 5 .venv/bin/python -m bench.sensitivity [--dataset filmtrust] \
        [--rho-sh 0,R,5R] [--rho-ns 0,R,5R]  (R: the default radius) [--rounds 100] [--worker 0/1]

Every cell is a FedRecGEL run at the paper's settings except the two radii (cell (0, 0) is
FedNCF), on the validation split, one seed. A cell reports the validation HR@10 / NDCG@10 at the
round chosen on validation HR@10 (evaluated every ``--eval-every`` rounds), and the test figures
at that round beside them. Finished runs are kept (``bench/trained.py``), so the command resumes
cell by cell; ``--worker i/n`` trains only the cells ``i, i+n, ...`` so that n processes can
share the grid, and ``--report-only`` rebuilds the outputs from the finished cells:
``bench/results/sensitivity-<dataset>.json`` and ``docs/sensitivity-<dataset>.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench.bench_cli import Positive, default_data_dir, opt
from bench.trained import ROOT, run_path, train_cached
from fedrecgel.config import DEFAULTS
from fedrecgel.data import load_split
from fedrecgel.simulate import TrainConfig

#: radii of the grid: none, the default of both radii, and five times that
GRID = f"0,{DEFAULTS.rho_sh},{5 * DEFAULTS.rho_sh}"


def cell_config(
    rho_sh: float, rho_ns: float, rounds: int, eval_every: int, seed: int
) -> TrainConfig:
    """The run of one cell (rho 0/0 is FedNCF: the same procedure with one pass)."""
    if rho_sh == 0 and rho_ns == 0:
        return TrainConfig(method="fedncf", rounds=rounds, eval_every=eval_every, seed=seed)
    return TrainConfig(
        method="fedrecgel",
        rho_sh=rho_sh,
        rho_ns=rho_ns,
        rounds=rounds,
        eval_every=eval_every,
        seed=seed,
    )


def _cell_figures(result: dict[str, Any]) -> dict[str, Any]:
    evald = [r for r in result["rounds"] if r["val"]]
    best = max(evald, key=lambda r: r["val"]["hr@10"])
    return {
        "round": best["round"],
        "val_hr@10": best["val"]["hr@10"],
        "val_ndcg@10": best["val"]["ndcg@10"],
        "test_hr@10": best["test"]["hr@10"],
        "test_ndcg@10": best["test"]["ndcg@10"],
        "final_val_hr@10": evald[-1]["val"]["hr@10"],
        "train_seconds": result["wall_seconds"],
    }


def _heatmap(
    out: Path, sh: list[float], ns: list[float], cells: dict[str, Any], title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, key, label in zip(
        axes,
        ("val_hr@10", "val_ndcg@10"),
        ("validation HR@10", "validation NDCG@10"),
        strict=True,
    ):
        grid = np.full((len(sh), len(ns)), np.nan)
        for i, a in enumerate(sh):
            for j, b in enumerate(ns):
                c = cells.get(f"{a},{b}")
                if c is not None:
                    grid[i, j] = 100 * c[key]
        cmap = plt.get_cmap("viridis").copy()
        cmap.set_bad("lightgray")
        im = ax.imshow(grid, cmap=cmap, origin="lower", aspect="auto")
        for i in range(len(sh)):
            for j in range(len(ns)):
                txt = "not run" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}"
                color = "black" if np.isnan(grid[i, j]) else "white"
                ax.text(j, i, txt, ha="center", va="center", color=color, fontsize=9)
        ax.set_xticks(range(len(ns)), [str(b) for b in ns])
        ax.set_yticks(range(len(sh)), [str(a) for a in sh])
        ax.set_xlabel("rho_ns (private)")
        ax.set_ylabel("rho_sh (shared)")
        ax.set_title(label)
        fig.colorbar(im, ax=ax)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(
    dataset: str = DEFAULTS.dataset,
    data_dir: Path | None = default_data_dir(),
    rho_sh: str = GRID,
    rho_ns: str = GRID,
    rounds: Positive = DEFAULTS.rounds,
    eval_every: int = 10,
    seed: int = 0,
    worker: Annotated[str, opt("i/n: train cells i, i+n, ... only")] = "0/1",
    report_only: bool = False,
    threads: int = 1,
) -> None:
    torch.set_num_threads(threads)
    try:
        sh = [float(x) for x in rho_sh.split(",")]
        ns = [float(x) for x in rho_ns.split(",")]
        idx, n_workers = (int(x) for x in worker.split("/"))
    except ValueError as err:
        raise SystemExit(f"bad grid or worker option: {err}") from None
    split = load_split(dataset, data_dir, validation=True)
    pairs = [(a, b) for a in sh for b in ns]
    if not report_only:
        for k, (a, b) in enumerate(pairs):
            if k % n_workers == idx:
                print(f"cell rho_sh={a} rho_ns={b}", flush=True)
                train_cached(split, cell_config(a, b, rounds, eval_every, seed))
    cells: dict[str, Any] = {}
    for a, b in pairs:
        cfg = cell_config(a, b, rounds, eval_every, seed)
        if run_path(split.name, cfg).exists():
            _, _, result = train_cached(split, cfg)
            cells[f"{a},{b}"] = {"rho_sh": a, "rho_ns": b, **_cell_figures(result)}
    out = {
        "dataset": dataset,
        "rho_sh": sh,
        "rho_ns": ns,
        "rounds": rounds,
        "eval_every": eval_every,
        "seed": seed,
        "settings": "paper settings (server Adam lr 0.001, client lr 0.1, 10% of users a round)",
        "cells_done": len(cells),
        "cells_total": len(pairs),
        "cells": cells,
    }
    path = ROOT / "bench" / "results" / f"sensitivity-{dataset}.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    _heatmap(
        ROOT / "docs" / f"sensitivity-{dataset}.png",
        sh,
        ns,
        cells,
        f"FedRecGEL on {dataset}: validation figures by SAM radius ({rounds} rounds, seed {seed})",
    )
    print(f"{len(cells)}/{len(pairs)} cells -> {path}", flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
