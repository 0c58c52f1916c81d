"""docs/RESULTS.md section of the dense against the lazy server Adam step (``server_update``,
``bench/server_step.py``): seconds at large catalogues, accuracy at the default preset. Used by
``bench/report.py``."""

from __future__ import annotations

import statistics
from typing import Any

from bench.report_common import load_result


def _pm(values: list[float]) -> str:
    pct = [100 * v for v in values]
    if len(pct) < 2:
        return f"{pct[0]:.2f}" if pct else "-"
    return f"{statistics.mean(pct):.2f} ± {statistics.stdev(pct):.2f}"


def _speed(speed: dict[str, Any]) -> list[str]:
    lines = [
        f"Synthetic data, {speed['points'][0]['users']:,} users (mean 14 interactions), "
        f"{speed['points'][0]['clients']:,} clients a round (the catalogue sweep of "
        f"`bench/scaling.py`), default model and client path, {speed['threads']} torch "
        "thread(s); three simulators in one process, interleaved round by round: *dense* (the "
        "default), *lazy* (rows: the items of the round's samples) and *lazy, scan* (rows found "
        "by scanning the aggregated gradient for nonzero rows, as the aggregator and the ray "
        "backend do). Median over the rounds after the first. *server step*: the strategy's "
        "`apply`; *round*: the whole round (client samples and step, aggregation, server step).",
        "",
        "| items | rows touched / round | dense server step s | lazy s | lazy, scan s | "
        "dense / lazy | dense round s | lazy round s | server share of the round, dense -> lazy "
        "| lazy = lazy, scan | 1-min load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in speed["points"]:
        d, lz, sc = p["dense"], p["lazy"], p["lazy-scan"]
        touched = statistics.median(p["touched_rows_per_round"])
        lines.append(
            f"| {p['items']:,} | {touched:,.0f} ({100 * touched / p['items']:.0f}%) | "
            f"{d['server_step_s']:.3f} | {lz['server_step_s']:.3f} | {sc['server_step_s']:.3f} | "
            f"{d['server_step_s'] / lz['server_step_s']:.1f}x | {d['round_s']:.2f} | "
            f"{lz['round_s']:.2f} | {100 * d['server_step_s'] / d['round_s']:.0f}% -> "
            f"{100 * lz['server_step_s'] / lz['round_s']:.0f}% | "
            f"{'yes' if p['lazy_equals_lazy_scan'] else 'no'} | {p['load_average']:.1f} |"
        )
    return lines


def _accuracy(acc: dict[str, Any], every: int) -> list[str]:
    lines = [
        f"Accuracy: `fedrec train` at the default preset with `--server-update dense` and "
        f"`lazy` (evaluation every {every} rounds), validation-selected test HR@10 (%), mean ± "
        "std over the seeds, and `--method popularity` on the same test candidates.",
        "",
        "| dataset | seeds | popularity | dense | lazy | lazy - dense |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in acc.items():

        def hr(key: str, runs: dict[str, Any] = runs) -> dict[int, float]:
            return {r["seed"]: r["selected_hr@10"] for r in runs.get(key, [])}

        dense, lazy, pop = hr("dense"), hr("lazy"), hr("popularity")
        seeds = sorted(set(dense) & set(lazy))
        if not seeds:
            continue
        diff = [lazy[s] - dense[s] for s in seeds]
        lines.append(
            f"| {name} | {','.join(map(str, seeds))} | "
            f"{_pm([pop[s] for s in seeds if s in pop])} | {_pm([dense[s] for s in seeds])} | "
            f"{_pm([lazy[s] for s in seeds])} | {100 * statistics.mean(diff):+.2f} |"
        )
    return lines


def section() -> list[str]:
    """The section (nothing when the benchmark has not been run)."""
    data = load_result("server_step.json")
    if data is None:
        return []
    lines = [
        "## Lazy server Adam at large catalogues (`bench/server_step.py`)",
        "",
        "The run setting `server_update: lazy` steps server Adam only on the item rows a round "
        "touched, each row's moments decayed over the rounds it missed (docs/API.md); the "
        "default `dense` steps every row. They differ in what an untouched row does: dense Adam "
        "moves it on its old, decaying momentum, lazy leaves it.",
        "",
    ]
    if "speed" in data:
        lines += [*_speed(data["speed"]), ""]
    if "accuracy" in data:
        lines += _accuracy(data["accuracy"], data.get("accuracy_eval_every", 1))
    return lines
