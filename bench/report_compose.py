"""The compose section of docs/RESULTS.md: the same run under docker compose and under
``fedrec up`` (``bench/compose_vs_loopback.py``). Used by ``bench/report.py``."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.report_common import load_result

RES = Path(__file__).resolve().parents[1] / "bench" / "results"


def compose() -> list[str]:
    """The same FilmTrust run under docker compose and under ``fedrec up``."""
    data = load_result(RES / "compose_vs_loopback.json")
    if data is None:
        return []
    cfg, machine = data["config"], data["machine"]
    ok = "yes" if data["round_ratio_within_target"] else "no"
    first_ok = (
        data["compose_up_to_first_closed_round_seconds"]
        <= data["up_to_first_closed_round_target_seconds"]
    )
    return [
        "## Docker compose vs `fedrec up` (`bench/results/compose_vs_loopback.json`)",
        "",
        f"FilmTrust, {cfg['rounds']} rounds, fraction {cfg['fraction']}, {cfg['workers']} workers "
        f"with {cfg['worker_torch_threads']} torch thread(s) each; compose: {cfg['compose']}; "
        f"loopback: {cfg['loopback']}; aggregator replicas under compose: "
        f"{cfg.get('aggregator_replicas', 3)}. Engine {machine['docker_engine']}, Compose "
        f"{machine['compose']}, {machine['cpus']} cores (1-min load at the end "
        f"{machine['load_avg_1m_at_end']:.1f}); medians of {len(data['runs']['compose'])} "
        "alternating runs each. Round time: steady state from the aggregator's clock.",
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| round under compose | {data['compose_round_seconds']:.2f} s | | |",
        f"| round under `fedrec up` | {data['loopback_round_seconds']:.2f} s | | |",
        f"| compose / `fedrec up` | {data['round_ratio']:.2f}x | <= "
        f"{data['round_ratio_target']}x | {ok} |",
        f"| `docker compose up` to first closed round (images built) | "
        f"{data['compose_up_to_first_closed_round_seconds']:.1f} s | <= "
        f"{data['up_to_first_closed_round_target_seconds']:.0f} s | "
        f"{'yes' if first_ok else 'no'} |",
        *_compose_phases(data, load_result(RES / "compose_vs_loopback_1replica.json")),
    ]


def _median_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for r in runs for k in r}
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}


def _compose_phases(data: dict[str, Any], one: dict[str, Any] | None) -> list[str]:
    """Where a worker's round goes under each, when the runs recorded it (medians over runs
    of each run's median over its worker-rounds); ``one``: the same measurement with one
    aggregator replica, when it ran."""
    kinds = {"compose": "compose", "loopback": "`fedrec up`"}
    phases: dict[str, dict[str, float]] = {}
    rounds = {"compose": data["compose_round_seconds"], "loopback": data["loopback_round_seconds"]}
    if data["runs"].get("loopback_postgres"):
        kinds["loopback_postgres"] = "`fedrec up` on PostgreSQL"
        rounds["loopback_postgres"] = data["loopback_postgres_round_seconds"]
    for kind in [k for k in kinds if k in data["runs"]]:
        runs = [r["worker_phases"] for r in data["runs"][kind] if r.get("worker_phases")]
        if not runs:
            return []
        phases[kind] = _median_phases(runs)
    if one is not None and all(r.get("worker_phases") for r in one["runs"]["compose"]):
        replicas = one["config"].get("aggregator_replicas", 1)
        kinds["one"] = f"compose, {replicas} replica (run {len(one['runs']['compose'])}x)"
        phases["one"] = _median_phases([r["worker_phases"] for r in one["runs"]["compose"]])
        rounds["one"] = one["compose_round_seconds"]
    names = [
        n
        for n in (
            "poll",
            "wait",
            "download",
            "compute",
            "encode",
            "upload",
            "commit",
            "evaluate",
            "report",
        )
        if any(phases[k].get(n, 0.0) >= 0.005 for k in kinds)
    ]
    lines = [
        "",
        "Where a worker's round goes (seconds, median over a run's worker-rounds after the "
        "first, then over runs; *wall / CPU*: CPU of the thread that ran the phase; upload, "
        "encode and report overlap other phases; *span*: from the poll answer the round "
        "started from to the worker's end of it; *round*: the steady round time above):",
        "",
        "| phase | " + " | ".join(kinds.values()) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for n in names:
        cells = [
            f"{phases[k].get(n, 0.0):.2f} / {phases[k].get('cpu_' + n, 0.0):.2f}" for k in kinds
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("| span | " + " | ".join(f"{phases[k]['span']:.2f}" for k in kinds) + " |")
    lines.append("| round | " + " | ".join(f"{rounds[k]:.2f}" for k in kinds) + " |")
    c, u = phases["compose"], phases["loopback"]
    most = max(names, key=lambda n: c.get(n, 0.0) - u.get(n, 0.0))
    extra = c.get(most, 0.0) - u.get(most, 0.0)
    extra_cpu = c.get("cpu_" + most, 0.0) - u.get("cpu_" + most, 0.0)
    extra_compute = c.get("cpu_compute", 0.0) - u.get("cpu_compute", 0.0)
    lines += [
        "",
        f"The phase that grows most under compose: {most}, {extra:+.2f} s of wall time a round "
        f"for {extra_cpu:+.3f} s of CPU (the worker waiting on the aggregator's answer, not "
        f"computing); the cohort step's CPU differs by {extra_compute:+.3f} s. Compose's "
        "aggregator writes to PostgreSQL behind the haproxy balancer, `fedrec up`'s to SQLite "
        "directly."
        + (
            f" With `fedrec up`'s aggregator on PostgreSQL a round takes "
            f"{rounds['loopback_postgres']:.2f} s ({rounds['loopback_postgres'] / rounds['loopback']:.2f}x "
            f"SQLite's): compose is {rounds['compose'] / rounds['loopback_postgres']:.2f}x that, "
            "the containers, the balancer and the replicas' share."
            if "loopback_postgres" in rounds
            else ""
        ),
        *_aggregator_stages(data, kinds),
    ]
    return lines


def _aggregator_stages(data: dict[str, Any], kinds: dict[str, str]) -> list[str]:
    """The aggregator's own stage times (its /metrics histograms) under each local arm that
    recorded them: the database's share without containers or balancer."""
    stages = ("validate", "commit", "aggregate", "close")
    arms = {
        k: [r["aggregator_stages"] for r in data["runs"][k] if r.get("aggregator_stages")]
        for k in kinds
        if k != "compose" and k in data["runs"]
    }
    arms = {k: v for k, v in arms.items() if v}
    if not arms:
        return []
    lines = [
        "",
        "The aggregator's own account (mean seconds per upload body or per close, from its "
        "`fedrec_agg_stage_seconds` and `fedrec_agg_round_close_seconds` histograms at the end "
        "of each run, median over runs; *commit*: the upload batch's transaction, waiting "
        "included; *close*: the whole close, *aggregate* included):",
        "",
        "| stage | " + " | ".join(kinds[k] for k in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for stage in stages:
        cells = [
            f"{statistics.median(r[stage]['mean_seconds'] for r in runs if stage in r):.3f}"
            if any(stage in r for r in runs)
            else "-"
            for runs in arms.values()
        ]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return lines
