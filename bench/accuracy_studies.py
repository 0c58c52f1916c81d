"""The tuning studies of the accuracy section of docs/RESULTS.md: each exported Optuna study's
trials and its validation curves beside the paper settings' and popularity's
(``bench/results/accuracy/studies/``). Used by ``bench/report.py``."""

from __future__ import annotations

import json
from typing import Any

from bench.accuracy_report import ACC, DOCS, RES, cell, reproduction, shipped
from fedrecgel.config import current_names


def studies() -> list[str]:
    """Each exported tuning study: its trials, and its validation curves beside the paper
    settings' (from the reproduction, seeds 0-2) and popularity's."""
    lines: list[str] = []
    for path in sorted((ACC / "studies").glob("*.json")):
        data = json.loads(path.read_text())
        lines += [
            f"### Tuning study `{data['study']}` (validation only, tuning seed)",
            "",
            "| trial | state | validation HR@10 | settings |",
            "|---|---|---|---|",
        ]
        for t in data["trials"]:
            if t["state"] == "WAITING":  # queued again after an interruption, not run
                continue
            value = "-" if t["value"] is None else f"{100 * t['value']:.2f}"
            last = max((int(k) for k in t["reports"]), default=0)
            state = {"COMPLETE": "complete", "PRUNED": f"pruned at round {last}"}.get(
                t["state"], f"interrupted after round {last}"
            )
            lines.append(f"| {t['number']} | {state} | {value} | {t['params']} |")
        key = _study_key(data["study"])
        pop = cell(key, "popularity")
        done = [t for t in data["trials"] if t["value"] is not None]
        if pop and done:
            best = max(done, key=lambda t: t["value"])
            lines += [
                "",
                f"Best completed trial: {best['number']}, validation HR@10 "
                f"{100 * best['value']:.2f}; popularity on the same validation items: "
                f"{100 * pop[0]['curve'][0]['val_hr@10']:.2f}.{_against_default(key, best)}",
            ]
        png = _study_plot(data)
        lines += ["", f"![study {data['study']}]({png})", ""]
    return lines


def _against_default(key: str, best: dict[str, Any]) -> str:
    """The shipped default's validation HR@10 on the same items and tuning seed
    (``bench/default_rule.py``'s grid), and whether the study's best beats it: a study that
    does not is no reason to ship a preset of its own."""
    path = RES / "default_rule" / f"{key.replace('/', '-')}.json"
    chosen = shipped()["default"]["rule"]["candidate"]
    if not path.exists():
        return ""
    entry = json.loads(path.read_text())["grid"].get(f"{key}|{chosen}")
    if entry is None:
        return ""
    default = 100 * entry["val_hr"]
    verdict = (
        "the study's best is above it"
        if 100 * best["value"] > default
        else "the study's best is not above it, so no preset of its own ships from it"
    )
    return (
        f" The shipped default (`{chosen}`) on the same validation items: {default:.2f}; {verdict}."
    )


def _paper_curves(key: str) -> list[list[tuple[int, float]]]:
    """Best validation HR@10 so far (%) by round of the paper-settings runs of ``key``: the
    faithful cell's seeds, else ``bench/reproduce.py``'s runs."""
    runs = [[(p["round"], 100 * p["val_hr@10"]) for p in r["curve"]] for r in cell(key, "faithful")]
    if not runs:
        rep = reproduction(key)
        runs = [
            [(r["round"], 100 * r["val"]["hr@10"]) for r in run["rounds"] if r["val"]]
            for run in (rep["runs"] if rep else [])
        ]
    out = []
    for run in runs:
        best, ys = 0.0, []
        for x, y in run:
            best = max(best, y)
            ys.append((x, best))
        out.append(ys)
    return out


def _study_key(study: str) -> str:
    """``<dataset>/<protocol>`` of a study named ``<dataset>-fedrecgel-<protocol>[-<tag>]``."""
    dataset, _, rest = study.partition("-fedrecgel-")
    return f"{dataset}/{rest.split('-')[0] or 'paper'}"


def _study_plot(data: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = _study_key(data["study"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in data["trials"]:
        if t["reports"]:
            xs = [int(k) for k in t["reports"]]
            ys = [100 * v for v in t["reports"].values()]
            ax.plot(
                xs,
                ys,
                marker="o",
                label=f"trial {t['number']} (server lr "
                f"{t['params'].get('server_lr', 0):.3g}, {current_names(t['params']).get('optimizer')})",
            )
    for i, ys in enumerate(_paper_curves(key)):
        ax.plot(
            [x for x, _ in ys],
            [y for _, y in ys],
            color="grey",
            alpha=0.7,
            label="paper settings, seeds 0-2" if i == 0 else None,
        )
    pop = cell(key, "popularity")
    if pop and pop[0]["curve"]:
        ax.axhline(100 * pop[0]["curve"][0]["val_hr@10"], color="k", ls="--", label="popularity")
    ax.set_xlabel("round")
    ax.set_ylabel("best validation HR@10 so far (%)")
    ax.set_title(f"{data['study']}: validation curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = f"accuracy_study_{data['study']}.png"
    fig.savefig(DOCS / name, dpi=100)
    plt.close(fig)
    return name
