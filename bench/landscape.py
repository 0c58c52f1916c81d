"""Loss landscapes of FedRecGEL and FedNCF: does SAM find flatter minima?

    nice -n 5 .venv/bin/python -m bench.landscape [--dataset filmtrust] [--points 13] [--grid 11]

Trains FedRecGEL and FedNCF (SAM off) with the same settings and seed (the paper's, 100 rounds;
finished runs are kept by ``bench/trained.py``), then around each model's final shared
parameters (item embeddings and score network; every user's private embeddings held at their
final values) evaluates the training loss (:class:`fedrecgel.landscape.TrainingLoss`):

* 1-D slices along ``--directions`` filter-normalised random directions, alpha in [-1, 1];
* a 2-D slice on the plane of two of them;
* sharpness: the mean loss increase at filter-normalised radius ``--radius`` (both signs, every
  direction), and the top Hessian eigenvalue by power iteration (autograd Hessian-vector
  products over the whole training loss).

Both models get the same random directions (same generator seed; each is filter-normalised to
its own parameters). Writes ``bench/results/landscape-<dataset>.json`` and
``docs/landscape-<dataset>-1d.png``, ``docs/landscape-<dataset>-2d.png``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import numpy as np
import torch

from bench.bench_cli import Positive, default_data_dir, opt
from bench.trained import ROOT, train_cached
from fedrecgel.config import DEFAULTS
from fedrecgel.data import load_split
from fedrecgel.landscape import (
    TrainingLoss,
    random_direction,
    sharpness,
    slice_1d,
    slice_2d,
    top_hessian_eigenvalue,
)
from fedrecgel.simulate import Method, TrainConfig

METHODS: tuple[Method, ...] = ("fedrecgel", "fedncf")


def study(args: SimpleNamespace, method: Method, split: Any) -> dict[str, Any]:
    """Slices and sharpness of one method's trained model."""
    cfg = TrainConfig(method=method, rounds=args.rounds, eval_every=args.eval_every, seed=args.seed)
    shared, private, result = train_cached(split, cfg)
    model = cfg.model(split.n_items)
    loss = TrainingLoss(
        model, split, private, cfg.n_negatives, seed=args.seed, max_samples=args.max_samples
    )
    gen = torch.Generator().manual_seed(args.seed + 1234)
    dirs = [random_direction(shared, gen) for _ in range(args.directions)]
    alphas = np.linspace(-1.0, 1.0, args.points)
    t0 = time.perf_counter()
    base = loss(shared)
    alpha_values = [float(a) for a in alphas]
    lines = [slice_1d(loss, shared, d, alpha_values) for d in dirs]
    print(f"{method}: 1-D slices {time.perf_counter() - t0:.0f} s", flush=True)
    sharp = sharpness(loss, shared, dirs, args.radius)
    t0 = time.perf_counter()
    betas = np.linspace(-1.0, 1.0, args.grid)
    beta_values = [float(b) for b in betas]
    plane = slice_2d(loss, shared, dirs[0], dirs[1], beta_values, beta_values)
    print(f"{method}: 2-D slice {time.perf_counter() - t0:.0f} s", flush=True)
    t0 = time.perf_counter()
    lam, hist = top_hessian_eigenvalue(
        lambda v: loss.hvp(shared, v),
        shared,
        torch.Generator().manual_seed(args.seed + 99),
        iters=args.power_iters,
    )
    print(
        f"{method}: top Hessian eigenvalue {lam:.4g} ({time.perf_counter() - t0:.0f} s)", flush=True
    )
    sel = result["selected_on_validation"]
    return {
        "config": result["config"],
        "selected_on_validation": sel,
        "loss_at_minimum": base,
        "n_samples": loss.n_samples,
        "alphas": alphas.tolist(),
        "slices_1d": [line.tolist() for line in lines],
        "grid": betas.tolist(),
        "slice_2d": plane.tolist(),
        "sharpness": {
            "radius": args.radius,
            "mean_increase": sharp["mean_increase"],
            "std_increase": float(np.std(sharp["increases"])),
            "increases": sharp["increases"],
        },
        "hessian_top_eigenvalue": lam,
        "hessian_power_iterations": hist,
    }


def verdict(flat: dict[str, float]) -> str:
    """One sentence on whether FedRecGEL's minimum is flatter (a 10% margin on both measures)."""
    s, h = (
        flat["sharpness_ratio_fedrecgel_over_fedncf"],
        flat["hessian_ratio_fedrecgel_over_fedncf"],
    )
    both = f"(sharpness ratio {s:.2f}, top-eigenvalue ratio {h:.2f}, one seed)"
    if s < 0.9 and h < 0.9:
        return f"FedRecGEL's minimum is flatter than FedNCF's on both measures {both}."
    if s > 1.1 and h > 1.1:
        return f"FedRecGEL's minimum is sharper than FedNCF's on both measures {both}."
    return (
        "No clear difference: the two measures do not both show FedRecGEL flatter by more "
        f"than 10% {both}."
    )


def plots(out: dict[str, Any], dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fedrecgel": "tab:blue", "fedncf": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for m in METHODS:
        res = out["methods"][m]
        for k, line in enumerate(res["slices_1d"]):
            ax.plot(
                res["alphas"],
                line,
                color=colors[m],
                alpha=0.8,
                label=f"{m} (sharpness {res['sharpness']['mean_increase']:.3g})"
                if k == 0
                else None,
            )
    ax.set_xlabel("step along a filter-normalised random direction (alpha)")
    ax.set_ylabel("training loss (BCE)")
    ax.set_title(f"{dataset}: 1-D loss slices around the trained shared parameters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"landscape-{dataset}-1d.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    vmax = max(float(np.max(out["methods"][m]["slice_2d"])) for m in METHODS)
    vmin = min(float(np.min(out["methods"][m]["slice_2d"])) for m in METHODS)
    levels = np.geomspace(vmin, vmax, 24)  # the loss grows fast away from the minimum
    for ax, m in zip(axes, METHODS, strict=True):
        res = out["methods"][m]
        g = res["grid"]
        cs = ax.contour(g, g, np.array(res["slice_2d"]).T, levels=levels, cmap="viridis")
        ax.clabel(cs, fontsize=7, fmt="%.2f")
        ax.plot([0], [0], "r+")
        ax.set_title(f"{m}: loss at minimum {res['loss_at_minimum']:.3f}")
        ax.set_xlabel("direction 1")
        ax.set_ylabel("direction 2")
    fig.suptitle(f"{dataset}: training loss on a plane of two filter-normalised directions")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"landscape-{dataset}-2d.png", dpi=110)
    plt.close(fig)


def main(
    dataset: str = DEFAULTS.dataset,
    data_dir: Path | None = default_data_dir(),
    seed: int = 0,
    rounds: Positive = DEFAULTS.rounds,
    eval_every: int = 10,
    directions: int = 3,
    points: Annotated[int, opt("points of each 1-D slice")] = 13,
    grid: Annotated[int, opt("points per axis of the 2-D slice")] = 11,
    max_samples: Annotated[int, opt("fixed subset of the training samples")] = 20000,
    radius: float = 0.25,
    power_iters: int = 15,
    methods: str = ",".join(METHODS),
    plot_only: Annotated[bool, opt("redraw from the JSON")] = False,
    threads: int = 1,
) -> None:
    args = SimpleNamespace(**locals())
    torch.set_num_threads(args.threads)
    if args.directions < 2:
        raise SystemExit("--directions must be >= 2 (the 2-D slice uses two)")
    path = ROOT / "bench" / "results" / f"landscape-{args.dataset}.json"
    if args.plot_only:
        plots(json.loads(path.read_text()), args.dataset)
        return
    split = load_split(args.dataset, args.data_dir, validation=True)
    out: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    out.setdefault("methods", {})
    out.update({"dataset": args.dataset, "seed": args.seed, "directions": args.directions})
    for m in args.methods.split(","):
        if m not in METHODS:
            raise SystemExit(f"unknown method {m!r}; known: {', '.join(METHODS)}")
        out["methods"][m] = study(args, m, split)
        path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if all(m in out["methods"] for m in METHODS):
        a, b = (out["methods"][m] for m in METHODS)
        out["flatter"] = {
            "sharpness_ratio_fedrecgel_over_fedncf": a["sharpness"]["mean_increase"]
            / b["sharpness"]["mean_increase"],
            "hessian_ratio_fedrecgel_over_fedncf": a["hessian_top_eigenvalue"]
            / b["hessian_top_eigenvalue"],
        }
        out["verdict"] = verdict(out["flatter"])
        path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        plots(out, args.dataset)
    print(json.dumps(out.get("flatter", {}), indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
