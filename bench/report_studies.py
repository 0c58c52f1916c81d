"""The RESULTS.md sections of the studies: centralized bound, sensitivity grid, loss landscape."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report_common import RES, load_result

ROOT = Path(__file__).resolve().parents[1]


def _pm(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    return f"{100 * stats['mean']:.2f} ± {100 * stats['std']:.2f}"


def central() -> list[str]:
    """The centralized NCF upper bound per dataset (bench/results/central.json)."""
    data = load_result(RES / "central.json")
    if data is None or not data.get("datasets"):
        return []
    lines = [
        "## Centralized upper bound (`bench/central.py`, validation split, %)",
        "",
        "The same NCF trained in one place (all users' samples in shuffled minibatches of 1,024,",
        "Adam over every parameter), mean ± std over the seeds listed. The Adam step size is",
        "chosen on validation only (one run per step size on tuning seed 100, test candidates",
        "replaced by the validation ones); the epoch per seed on validation HR@10 (*selected*);",
        "*best test* is the optimistic pick. Datasets missing here were not run to the end.",
        "",
        "| dataset / protocol | lr (val HR@10 of each lr) | epochs | seeds | selected HR@10 | selected NDCG@10 | best test HR@10 | best test NDCG@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, row in data["datasets"].items():
        if row is None:
            continue
        grid = ", ".join(f"{lr}: {100 * v:.2f}" for lr, v in row["lr_grid"].items())
        sel, best = row.get("selected", {}), row.get("best_test", {})
        lines.append(
            f"| {key} | {row['lr']} ({grid}) | {row['epochs']} | "
            f"{','.join(str(s) for s in row['seeds'])} | {_pm(sel.get('hr@10'))} | "
            f"{_pm(sel.get('ndcg@10'))} | {_pm(best.get('hr@10'))} | {_pm(best.get('ndcg@10'))} |"
        )
    return [*lines, ""]


def sensitivity() -> list[str]:
    """The rho_sh x rho_ns grids (bench/results/sensitivity-*.json)."""
    out: list[str] = []
    for path in sorted(RES.glob("sensitivity-*.json")):
        data = json.loads(path.read_text())
        ds = data["dataset"]
        out += [
            f"## Sensitivity to the SAM radii on {ds} (`bench/sensitivity.py`)",
            "",
            f"FedRecGEL at {data['settings']}, {data['rounds']} rounds, seed {data['seed']}, "
            f"every radius pair of the grid ({data['cells_done']} of {data['cells_total']} "
            "cells run). Validation HR@10 / NDCG@10 (%) at the round chosen on validation "
            f"(evaluated every {data['eval_every']} rounds; NDCG@10 at that same round); "
            "rho 0/0 is FedNCF. The grid (0, the default radius, 5 times it) is ours: the "
            "paper's grid values are not documented here. Heatmap: "
            f"`docs/sensitivity-{ds}.png`.",
            "",
            "| rho_sh \\ rho_ns | " + " | ".join(str(b) for b in data["rho_ns"]) + " |",
            "|---|" + "---|" * len(data["rho_ns"]),
        ]
        for a in data["rho_sh"]:
            cells = []
            for b in data["rho_ns"]:
                c = data["cells"].get(f"{a},{b}")
                cells.append(
                    "not run"
                    if c is None
                    else f"{100 * c['val_hr@10']:.2f} / {100 * c['val_ndcg@10']:.2f}"
                )
            out.append(f"| {a} | " + " | ".join(cells) + " |")
        vals = [c["val_hr@10"] for c in data["cells"].values()]
        if len(vals) > 1:
            out += [
                "",
                f"Spread of validation HR@10 over the cells run: {100 * (max(vals) - min(vals)):.2f}"
                " points, one seed per cell: compare with the seed std of the reproduction table.",
            ]
        out.append("")
    return out


def landscape() -> list[str]:
    """Sharpness of FedRecGEL vs FedNCF (bench/results/landscape-*.json)."""
    out: list[str] = []
    for path in sorted(RES.glob("landscape-*.json")):
        data = json.loads(path.read_text())
        ds = data["dataset"]
        methods = data.get("methods", {})
        if len(methods) < 2:
            continue
        out += [
            f"## Loss landscape on {ds} (`bench/landscape.py`)",
            "",
            "Training loss (mean BCE of every user's training positives with 4 fixed negatives",
            f"each, a fixed uniform subset of {min(r['n_samples'] for r in methods.values()):,} "
            "of those samples; private embeddings at their final values), one seed, "
            f"{data['directions']} directions, around each model's final shared",
            "parameters, along filter-normalised random directions (Li et al. 2018; the same",
            "random draws for both models). *sharpness*: mean loss increase at filter-normalised",
            "radius r over both signs of every direction; *top eigenvalue*: largest Hessian",
            "eigenvalue of the loss w.r.t. the shared parameters (power iteration). Plots:",
            f"`docs/landscape-{ds}-1d.png`, `docs/landscape-{ds}-2d.png`.",
            "",
            "| method | validation-selected test HR@10 | loss at minimum | sharpness (r) | top Hessian eigenvalue |",
            "|---|---|---|---|---|",
        ]
        for m, r in methods.items():
            sel = r.get("selected_on_validation") or {}
            sh = r["sharpness"]
            out.append(
                f"| {m} | {100 * sel.get('hr@10', float('nan')):.2f} | "
                f"{r['loss_at_minimum']:.4f} | {sh['mean_increase']:.4f} ± "
                f"{sh['std_increase']:.4f} ({sh['radius']}) | {r['hessian_top_eigenvalue']:.4g} |"
            )
        flat = data.get("flatter")
        if flat:
            out += [
                "",
                f"FedRecGEL / FedNCF: sharpness ratio "
                f"{flat['sharpness_ratio_fedrecgel_over_fedncf']:.3f}, top-eigenvalue ratio "
                f"{flat['hessian_ratio_fedrecgel_over_fedncf']:.3f} (below 1: FedRecGEL flatter).",
            ]
        if data.get("verdict"):
            out += ["", data["verdict"]]
        out.append("")
    return out
