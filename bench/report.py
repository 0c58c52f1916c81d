"""Write docs/RESULTS.md from the JSON under bench/results/ (nothing in it is typed by hand).

.venv/bin/python -m bench.report
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import (
    diagnosis_report,
    full_ranking,
    popularity_prior,
    rank_fit,
    report_dashboard,
    report_demo,
    report_http,
    report_ray,
    report_server_step,
    report_serving,
    report_simulator,
    report_studies,
    retention_report,
    soak_report,
)
from bench.accuracy_report import ACC
from bench.accuracy_report import section as accuracy_section
from bench.accuracy_studies import studies as accuracy_studies
from bench.privacy_report import section as privacy_section
from bench.report_common import load_result
from bench.report_compose import compose
from bench.secagg_report import section as secagg_section

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "bench" / "results"

#: HR@10 / NDCG@10 (%) from the paper's own sensitivity data (FedRecGEL), and
#: the authors' code run on this protocol (seed 0, 100 rounds, best test round).
PAPER = {"filmtrust": (91.77, 81.75), "lastfm-2k": (80.69, 73.56), "amazon-video": (62.71, 41.26)}
AUTHORS_CODE = {
    ("filmtrust", "fedrecgel"): (91.77, 82.50),
    ("filmtrust", "fedncf"): (91.85, 82.13),
    ("lastfm-2k", "fedrecgel"): (66.06, 46.98),
}


def _pm(summary: dict[str, float], key: str) -> str:
    m, s = summary.get(f"{key}.mean"), summary.get(f"{key}.std")
    if m is None or s is None:
        return "-"
    return f"{100 * m:.2f} ± {100 * s:.2f}"


def reproduction() -> list[str]:
    """The reproduction table."""
    lines = [
        "## Reproduction (100 rounds, 3 seeds, mean ± std, %)",
        "",
        "Produced by `python -m bench.reproduce` through `fedrec train`. *paper split*: the paper's",
        "leave-one-out, best test round (the paper's optimistic figure). *validation split*: the",
        "second-latest item is held out too; *selected* is the test figure at the round with the",
        "best validation HR@10 (the honest figure), *best test* the optimistic one on that split.",
        "*s / run*: wall seconds per seed (training and per-round evaluation); most runs shared",
        "the 2 cores with other jobs, so this column is only a rough guide.",
        "",
        "| dataset | method | rho (sh, ns) | paper split HR@10 | NDCG@10 | validation split: selected HR@10 | selected NDCG@10 | best test HR@10 | paper (FedRecGEL) | authors' code | s / run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = RES / "reproduce"
    for dataset in ("filmtrust", "amazon-video", "lastfm-2k"):
        for method in ("fedrecgel", "fedncf"):
            paper = load_result(base / dataset / f"{method}-paper" / "results.json")
            val = load_result(base / dataset / f"{method}-validation" / "results.json")
            if paper is None and val is None:
                continue
            ref = paper or val
            assert ref is not None
            cfg = ref["runs"][0]["config"]
            rho = "0, 0" if method == "fedncf" else f"{cfg['rho_sh']}, {cfg['rho_ns']}"
            ps = paper["summary"] if paper else {}
            vs = val["summary"] if val else {}
            walls = [r["wall_seconds"] for r in ref["runs"]]
            pp = PAPER.get(dataset) if method == "fedrecgel" else None
            ac = AUTHORS_CODE.get((dataset, method))
            lines.append(
                f"| {dataset} | {method} | {rho} | {_pm(ps, 'best_test.hr@10')} | "
                f"{_pm(ps, 'best_test.ndcg@10')} | {_pm(vs, 'selected.hr@10')} | "
                f"{_pm(vs, 'selected.ndcg@10')} | {_pm(vs, 'best_test.hr@10')} | "
                f"{f'{pp[0]} / {pp[1]}' if pp else '-'} | {f'{ac[0]} / {ac[1]}' if ac else '-'} | "
                f"{sum(walls) / len(walls):.0f} |"
            )
    return lines


def speed() -> list[str]:
    """The simulator speed figures."""
    sp = load_result(RES / "speed.json")
    if sp is None:
        return []
    ft, ev = sp["filmtrust"], sp["evaluation"]
    lines = [
        "## Simulator speed (`bench/speed.py`)",
        "",
        f"Machine: {sp['machine']['threads']} torch threads, torch {sp['machine']['torch']}.",
        "",
        "| what | figure | target |",
        "|---|---|---|",
        f"| FilmTrust round ({ft['clients_per_round']} clients, {ft['samples_last_round']} samples), "
        f"batched simulator | {ft['simulator_s_per_round_median']:.3f} s | |",
        f"| same round, per-client loop reference, same run | "
        f"{ft['per_client_loop_s_per_round_median']:.3f} s | |",
        f"| speed-up | {ft['speedup']:.1f}x | >= 20x |",
        *(
            [
                f"| per-client loop that also samples negatives with Python loops, as the "
                f"authors' code does | {ft['speedup_vs_loop_with_python_loop_sampling']:.1f}x | |",
                f"| uploads, batched vs per-client loop, round 1 (max relative difference) | "
                f"{ft['max_rel_upload_difference_round_1']:.1e} | <= 1e-5 |",
            ]
            if "max_rel_upload_difference_round_1" in ft
            else []
        ),
        f"| evaluation, all {ev['users']} users x 100 candidates ({ev['dataset']}) | "
        f"{ev['seconds_median']:.3f} s | < 1 s |",
    ]
    sc = sp.get("scale")
    if sc:
        lines += [
            f"| synthetic {sc['users']:,} users x {sc['items']:,} items, "
            f"{sc['clients_per_round']} clients: round | {sc['seconds_per_round_median']:.2f} s | "
            "seconds |",
            f"| same, peak RSS of the whole process (data included) | {sc['peak_rss_mb']:.0f} MB | "
            "< 4096 MB |",
        ]
    return lines


def _storage_before() -> str:
    """The SQLite run of the code before 64 KB pages, version blobs apart and passes at most
    once a second (``aggregator_storage_before.json``), if kept."""
    data = load_result(RES / "aggregator_storage_before.json")
    rows = [b for b in (data or {}).get("backends", []) if b["backend"] == "sqlite"]
    if not rows:
        return ""
    b = rows[0]
    return (
        f" Before this session's storage changes (4 KB pages, a version's blobs in its row, a "
        f"pass after every close) the SQLite run peaked at {b['peak_mb']:.1f} MB, "
        f"{b['after_compaction_mb']:.1f} MB after compaction, in {b['wall_s']:.0f} s."
    )


def aggregator_storage() -> list[str]:
    """Database size over a long run: a table per backend, then the size of each table."""
    data = load_result(RES / "aggregator_storage.json")
    if data is None:
        return []
    st = data["settings"]
    lines = [
        "## Aggregator storage (`bench/aggregator_storage.py`)",
        "",
        f"{data['rounds']} {data['dataset']} rounds over HTTP ({data['workers']} workers), "
        "default settings: the newest "
        f"{st['keep_latest_versions']} model versions and every {st['keep_every_versions']}th "
        "keep their params, update bodies are deleted once their round is over (by a background "
        "thread woken by each close, one pass at most every second); SQLite is compacted at most "
        f"every {st['compact_interval_s']:g} s, PostgreSQL vacuumed after each such pass. SQLite: "
        "bytes of the database, WAL and shared-memory files (64 KB pages, a checkpoint every "
        "16 MB of WAL); PostgreSQL: `pg_database_size` (its WAL excluded). *Peak* is the "
        "largest size seen as rounds closed, *after compaction* the size once the last "
        "compaction ran. Before bounded storage the database grew by about 35 MB a round "
        "(704 MB after 20 rounds)." + _storage_before(),
        "",
        "| backend | peak MB | end of run MB | after compaction MB | target | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for b in data["backends"]:
        lines.append(
            f"| {b['backend']} | {b['peak_mb']:.1f} | {b['end_of_run_mb']:.1f} | "
            f"{b['after_compaction_mb']:.1f} | < {data['target_mb']:g} MB | {b['wall_s']:.0f} |"
        )
    for b in data["backends"]:
        lines += [
            "",
            f"Size by table after the run, {b['backend']} (MB, indexes included):",
            "",
            "| table | MB |",
            "|---|---|",
        ]
        lines += [f"| {name} | {mb:.2f} |" for name, mb in b["tables_mb"].items() if mb >= 0.005]
    return lines


def fuzzing() -> list[str]:
    """Schema-driven fuzzing of each service, per credential kind, and what it found."""
    data = load_result(RES / "fuzz.json")
    if data is None:
        return []
    lines = [
        "## Fuzzing the services (`bench/fuzz_services.py`)",
        "",
        f"The three services as processes on loopback, after a {data['training_s']:.0f} s "
        f"{data['dataset']} run gave them their state; schemathesis {data['schemathesis']} "
        f"generated {data['examples_per_operation_and_mode']} valid and "
        f"{data['examples_per_operation_and_mode']} invalid requests per operation of each "
        f"OpenAPI document (seed {data['seed']}), once per credential kind the service knows; "
        "recommend_api once more with its document narrowed to the served model, so the "
        "generated vectors reach the ranking. *Violations*: answers the document does not "
        "describe (status, content type, headers, body schema); *invalid accepted*: invalid "
        "requests answered with a success; *no answer*: no answer within "
        f"{data['request_timeout_s']:g} s. The aggregator ran under a "
        f"{data['aggregator_address_space_limit_gb']:g} GB address-space limit. "
        f"{data['wall_s']:.0f} s in all.",
        "",
        "| service | credential | requests | 2xx | 4xx | 5xx | violations | invalid accepted "
        "| no answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    findings: list[str] = []
    for service, kinds in data["services"].items():
        for kind, t in kinds.items():
            by_status = {int(k): v for k, v in t["by_status"].items()}
            ok = sum(v for k, v in by_status.items() if 200 <= k < 300)
            client = sum(v for k, v in by_status.items() if 400 <= k < 500)
            lines.append(
                f"| {service} | {kind} | {t['requests']} | {ok} | {client} | "
                f"{t['server_errors']} | {t['schema_violations']} | {t['invalid_accepted']} | "
                f"{t['transport_errors']} |"
            )
            findings += [
                f"- {service}, {kind}: `{f['operation']}` {f['check']} (status {f['status']})"
                for f in t["findings"]
            ]
    alive = "; ".join(
        f"{kind}: {', '.join(p for p, up in procs.items() if up) or 'none'}"
        for kind, procs in data["alive_after_aggregator_fuzzing"].items()
    )
    lines += [
        "",
        f"Processes still running after the aggregator's turn with each credential: {alive}.",
    ]
    after = data["alive_after_aggregator_fuzzing"].values()
    if not all(procs.get("worker", True) for procs in after):
        tail = data.get("worker_log_tail") or ["(none)"]
        lines[-1] += f" The worker's last log line: `{tail[-1]}`."
    if findings:
        lines += ["", "Findings (first of each kind; the JSON has the requests):", "", *findings]
    return lines


def other(name: str, title: str) -> list[str]:
    """Any other benchmark JSON, shown as it is."""
    data = load_result(RES / name)
    if data is None:
        return []
    return [
        f"## {title} (`bench/results/{name}`)",
        "",
        "```json",
        json.dumps(data, indent=1),
        "```",
    ]


def baselines() -> list[str]:
    """Popularity / random / centralized reference points per dataset and protocol."""
    data = load_result(RES / "baselines.json")
    if data is None:
        return []
    lines = [
        "## Reference points: popularity, random, co-occurrence, centralized (validation split, HR@10 / NDCG@10 %)",
        "",
        "Produced by `python -m bench.baselines`. *popularity* ranks every user's candidates by how many",
        "users trained on the item; *random* is chance (mean ± std over 3 seeds); *co-occurrence*",
        "(`fedrec train --method cooccurrence`) scores them by the user's own items times the",
        "rank-k part of the users' item co-occurrence (each user a unit-norm row; k chosen on",
        "validation, shown in brackets): a linear item-item model, computable in one federated",
        "round; *central* is the same NCF trained in one place (when measured). A federated",
        "model near *popularity* has learned item popularity and little else. Lastfm-2K *clean*:",
        "repeated user-artist pairs merged before the leave-one-out, so no held-out item is also",
        "a training item.",
        "",
        "| dataset / protocol | popularity HR@10 | popularity NDCG@10 | random HR@10 | co-occurrence HR@10 | co-occurrence NDCG@10 | central HR@10 (selected) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in data.items():
        pop, rnd, cen = row.get("popularity", {}), row.get("random", {}), row.get("central", {})
        co = row.get("cooccurrence", {})
        rank = f" (k {co['rank']})" if "rank" in co else ""
        lines.append(
            f"| {key} | {_pm(_sel(pop), 'hr@10')} | {_pm(_sel(pop), 'ndcg@10')} "
            f"| {_pm(_sel(rnd), 'hr@10')} | {_pm(_sel(co), 'hr@10')}{rank} "
            f"| {_pm(_sel(co), 'ndcg@10')} | {_pm(_sel(cen), 'hr@10')} |"
        )
    return lines


def _sel(fig: dict[str, float]) -> dict[str, float]:
    """The validation-selected figures of a baselines.json entry, keyed like reproduce's."""
    return {k.removeprefix("selected."): v for k, v in fig.items() if k.startswith("selected.")}


def accuracy() -> list[str]:
    """The accuracy section: tables and curves, tuning studies, targets and their readings."""
    if not ACC.exists():
        return []
    return [
        *popularity_prior.section(),
        "",
        *full_ranking.section(),
        "",
        *rank_fit.section(),
        "",
        *accuracy_section(),
        "",
        *diagnosis_report.section(),
        "",
        *accuracy_studies(),
    ]


def main() -> None:
    """Write docs/RESULTS.md (a command without options: ``--help`` says so and writes
    nothing, an option is refused)."""
    parts = [
        "# Results",
        "",
        "Generated by `python -m bench.report` from `bench/results/*.json`; rerun the benchmarks and this",
        "script to refresh. Timings are from a shared 2-core machine and drift between runs;",
        "ratios are measured within one run.",
        "",
        *accuracy(),
        "",
        *reproduction(),
        "",
        *baselines(),
        "",
        *report_studies.central(),
        *report_studies.sensitivity(),
        *report_studies.landscape(),
        *speed(),
        "",
        *report_simulator.before_after(),
        "",
        *report_simulator.roofline(),
        "",
        *report_simulator.memory(),
        "",
        *report_simulator.scaling(),
        "",
        *report_server_step.section(),
        "",
        *report_ray.section(),
        "",
        *other("aggregator_ingest.json", "Aggregator ingest"),
        "",
        *aggregator_storage(),
        "",
        *retention_report.section(),
        *soak_report.section(),
        "",
        *report_serving.serving(),
        "",
        *report_serving.shortlist_recall(),
        "",
        *report_serving.serving_before_after(),
        "",
        *other("recommend_load.json", "Recommendation API load"),
        "",
        *other("evaluation.json", "Evaluation of all Amazon-Video users"),
        "",
        *report_serving.evaluation_before_after(),
        "",
        *report_http.section(),
        "",
        *report_demo.section(),
        "",
        *report_dashboard.section(),
        "",
        *compose(),
        "",
        *fuzzing(),
        "",
        *secagg_section(),
        "",
        *privacy_section(),
    ]
    (ROOT / "docs" / "RESULTS.md").write_text("\n".join(parts).rstrip() + "\n")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
