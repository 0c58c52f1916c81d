"""The "Secure aggregation cost" section of docs/RESULTS.md, from bench/results/secagg_cost.json
(written by bench/secagg_cost.py); bench/report.py includes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.report_common import as_module, load_result, prior_choice_note
from bench.secagg_prior import ARMS, COHORTS
from fedrecgel.model import ModelConfig
from fedrecgel.secagg.layout import vector_length

RES = Path(__file__).resolve().parents[1] / "bench" / "results" / "secagg_cost.json"
HTTP = RES.with_name("secagg_http.json")
#: the same bench before a worker sent its masked inputs in batches (one request per client)
HTTP_BEFORE = RES.with_name("secagg_http_before.json")
#: the same bench before the worker took its client step out of a thread of its own and the
#: recording kept the bodies' sizes only
HTTP_EARLIER = RES.with_name("secagg_http_earlier.json")
ROWS = RES.with_name("secagg_rows.json")
POOL = RES.with_name("negative_pool.json")
UNION = RES.with_name("secagg_union.json")
PRIOR = RES.with_name("secagg_prior.json")
#: probes of other pools (``python -m bench.secagg_prior --pool N --out ...``)
PROBES = "secagg_prior-pool*.json"


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


def section() -> list[str]:
    """Markdown lines (empty when the benchmark has not run)."""
    doc = load_result(RES)
    if doc is None:
        return []
    data: dict[str, Any] = doc["datasets"]
    lines = [
        "## Secure aggregation cost (per round, against plain sparse uploads)",
        "",
        "Produced by `nice -n 5 .venv/bin/python -m bench.secagg_cost` (default run settings,",
        "`secure_aggregation=dense`: SecAgg+ with 8 neighbours on either side, threshold",
        "deg - floor(0.3 deg), fixed point 2^-32 in 64-bit words). Round 1's cohort takes one",
        "client step; the same uploads then go as plain sparse bodies and through a secure",
        "round. Bytes are exact message sizes; seconds were measured one client after another",
        "in the same run on a shared, loaded 2-core machine, so read the ratios, not the",
        "absolute times. A client's cost depends on its neighbourhood, not on the cohort, so",
        "per-client figures measured on the first clients of the cohort hold for all of it;",
        "*per round* multiplies them by the full cohort's size.",
        "",
        "| dataset | items | vector (values) | clients measured / cohort | plain upload / client (MB) | secure upload / client (MB) | bytes ratio | secure download / client (KB) | per round: plain / secure upload (MB) | client s ratio (secure / plain encode) | secure client s / training step | server s ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in data.items():
        p, s, r, full = d["plain"], d["secagg"], d["ratio"], d["per_round_full_cohort"]
        lines.append(
            f"| {name} | {d['n_items']} | {d['vector_length']} | "
            f"{d['clients_measured']} / {d['full_cohort']} | "
            f"{_mb(p['upload_bytes_per_client'])} | {_mb(s['upload_bytes_per_client'])} | "
            f"{r['upload_bytes']:.1f}x | {s['download_bytes_per_client'] / 1e3:.1f} | "
            f"{full['plain_upload_mb']:.0f} / {full['secagg_upload_mb']:.0f} | "
            f"{r['client_s']:.0f}x | {r['client_s_vs_train_step']:.1f}x | {r['server_s']:.1f}x |"
        )
    lines += [
        "",
        "The secure upload is the dense vector in 8-byte words (every item row of both tables,",
        "the score network and the loss) plus the key, share and reveal messages (a few KB); the",
        "client seconds are mostly the neighbourhood's mask keystreams over that vector. Each",
        "benchmark run checks that the unmasked sum equals the plain sum within the",
        "fixed-point step (`max_abs_error_of_sum` in the JSON).",
    ]
    return (
        lines
        + sparse_section()
        + http_section()
        + rows_section()
        + union_section()
        + prior_section()
    )


def sparse_section() -> list[str]:
    """The rows of ``secure_aggregation=sparse`` (empty when they were not measured)."""
    sparse: dict[str, dict[str, Any]] = json.loads(RES.read_text()).get("sparse", {})
    if not sparse:
        return []
    lines = [
        "",
        "`secure_aggregation=sparse` (`--pools`: `.venv/bin/python -m bench.secagg_cost",
        "--datasets NAME --pools 64,128,256`): negatives from a public pool of that many items a",
        "round; instance A masks each client's 0/1 item indicator (outside the pool) in the",
        "narrowest word that counts the cohort, instance B (fresh mask keys) masks the rows of the",
        "union U (counted items and the pool) of both tables, the score network and the loss in",
        "32-bit words. Against plain uploads with the *same* pool; U and the rings are the full",
        "cohort's. *Floor*: the rows of the cohort's items outside the pool alone, with the score",
        "network and the loss, in 32-bit words (the default model), over a plain upload: what",
        "any mask over the rows the cohort touches costs, without the pool's rows and A.",
        "",
        "| dataset | pool | U rows (share of items) | words A / B (scale) | plain upload / client (MB) | sparse upload / client (MB) | bytes ratio | floor | per round: plain / sparse upload (MB) | client s ratio | sparse client s / training step | server s ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_pool in sparse.items():
        for pool, d in sorted(by_pool.items(), key=lambda kv: int(kv[0])):
            p, s, r = d["plain_same_pool"], d["sparse"], d["ratio"]
            full = d["per_round_full_cohort"]
            lines.append(
                f"| {name} | {pool} | {d['union_rows']} ({d['union_share_of_items']:.0%}) | "
                f"{d['counts_words']} / {d['update_words']} (2^-{d['update_scale_bits']}) | "
                f"{_mb(p['upload_bytes_per_client'])} | {_mb(s['upload_bytes_per_client'])} | "
                f"{r['upload_bytes']:.1f}x | {_floor(d):.2f}x | "
                f"{full['plain_upload_mb']:.0f} / {full['sparse_upload_mb']:.0f} | "
                f"{r['client_s']:.0f}x | {r['client_s_vs_train_step']:.1f}x | "
                f"{r['server_s']:.1f}x |"
            )
    return lines + pool_accuracy()


def _floor(d: dict[str, Any]) -> float:
    """A sparse row's floor over its plain upload: the counted rows (U less the pool), the
    score network and the loss, 4 bytes a value."""
    counted = np.arange(d["union_rows"] - d["negative_pool"])
    values = vector_length(ModelConfig(d["n_items"]), counted)
    return 4 * values / float(d["plain_same_pool"]["upload_bytes_per_client"])


def pool_accuracy() -> list[str]:
    """What pool negatives cost in accuracy (bench/negative_pool.py; empty when not run)."""
    doc = load_result(POOL)
    if doc is None:
        return []
    lines = [
        "",
        "Accuracy of pool negatives, plain uploads (`.venv/bin/python -m bench.negative_pool`:",
        f"`fedrec train` on {doc['dataset']} at the defaults, {doc['rounds']} rounds, test HR@10 /",
        "NDCG@10 at the round selected on validation, same seeds):",
        "",
        "| negatives | seeds | HR@10 per seed | mean HR@10 | mean NDCG@10 |",
        "|---|---|---|---|---|",
    ]
    for p in doc["pools"]:
        what = "uniform over the catalogue" if p["pool"] is None else f"pool of {p['pool']}"
        seeds = ", ".join(str(r["seed"]) for r in p["runs"])
        per = ", ".join(f"{r['hr@10']:.4f}" for r in p["runs"])
        lines.append(
            f"| {what} | {seeds} | {per} | {p['mean_hr@10']:.4f} | {p['mean_ndcg@10']:.4f} |"
        )
    return lines


def _masked_requests(arm: dict[str, Any], rounds: int) -> str:
    fam = arm["bytes_by_family"]
    n = [fam[k]["requests"] / rounds for k in ("secagg masked", "secagg masked_b") if k in fam]
    return " + ".join(f"{x:.1f}" for x in n) if n else "-"


def http_section() -> list[str]:
    """The HTTP measurement (bench/secagg_http.py), when it has run: plain, dense and sparse in
    one run, and the seconds of the same bench before masked inputs were sent in batches."""
    d = load_result(HTTP)
    if d is None:
        return []
    old: dict[str, Any] = load_result(HTTP_BEFORE) or {}
    earlier: dict[str, Any] = load_result(HTTP_EARLIER) or {}
    arms = [("plain", "off"), ("secure, dense", "dense"), ("secure, sparse", "sparse")]
    lines = [
        "",
        "### Over HTTP (aggregator process and workers, per round)",
        "",
        f"Produced by `{as_module(d['command'])}`: the same {d['dataset']} run ({d['rounds']} rounds, "
        f"cohorts of {d['off']['cohort']}, 2 shards, every arm's negatives from the same public "
        f"pool of {d.get('negative_pool')} items) plain, with `secure_aggregation=dense` and with",
        "`secure_aggregation=sparse`, the real aggregator process (SQLite) and both workers",
        "stepped in one process behind a recording transport (which keeps the bodies' sizes",
        "only: holding every body of a run made each new body fresh memory, a cost of the",
        "bench, not of the protocol, and larger in the secure arms). Bytes are every body the",
        "workers sent for training (plain: `/updates`; secure: the `/secagg` steps); seconds",
        "are each run's wall time over its rounds. The machine is shared and its speed drifts by tens of",
        f"percent within minutes, so the three arms ran {d.get('repeats', 1)} times, interleaved:",
        "seconds per round are each arm's median, *seconds / plain* the median of the repeats'",
        "ratios (each repeat's in brackets); read the ratios, not the absolute figures. *Masked",
        "requests*: the bodies of masked inputs a round (sparse: instance A + instance B), a",
        "worker's clients' inputs sent in batches of up to 8 MiB, each masked while the one",
        "before it is on the wire; *before batching*: the same bench when each client's masked",
        "input was a request of its own (`bench/results/secagg_http_before.json`); *earlier*:",
        "each arm's seconds in the committed run before the worker took its client step out of",
        "a thread of its own and the recording kept the bodies' sizes only",
        "(`bench/results/secagg_http_earlier.json`). Target: secure <= 2x plain in bytes and in",
        "time.",
        "",
        "| mode | upload per round (MB) | secagg reads per round (MB) | masked requests per round "
        "| seconds per round (earlier) | bytes / plain | seconds / plain "
        "| seconds / plain before batching |",
        "|---|---|---|---|---|---|---|---|",
    ]
    p = d["off"]
    for name, key in arms:
        if key not in d:
            continue
        a = d[key]
        reads = a["secagg_download_bytes_per_round"]
        before = "-"
        if key in old and key != "off":
            before = f"{old[key]['seconds_per_round'] / old['off']['seconds_per_round']:.2f}x"
        seconds = "1.00x"
        if key != "off":
            r = d["ratio"][f"{key}/off"]
            each = ", ".join(f"{x:.2f}" for x in r.get("seconds_runs", []))
            seconds = f"{r['seconds']:.2f}x" + (f" ({each})" if each else "")
            if f"{key}/off" in earlier.get("ratio", {}):
                seconds += f"; earlier {earlier['ratio'][f'{key}/off']['seconds']:.2f}x"
        own = f"{a['seconds_per_round']:.2f}"
        if key in earlier:
            own += f" ({earlier[key]['seconds_per_round']:.2f})"
        lines.append(
            f"| {name} | {_mb(a['upload_bytes_per_round'])} | {_mb(reads) if reads else '-'} | "
            f"{_masked_requests(a, d['rounds']) if key != 'off' else '-'} | "
            f"{own} | "
            f"{a['upload_bytes_per_round'] / p['upload_bytes_per_round']:.2f}x | "
            f"{seconds} | {before} |"
        )
    lines += _waits(d)
    return lines


def _waits(d: dict[str, Any]) -> list[str]:
    """Seconds a round the workers' requests took to be answered, by endpoint family (plain and
    sparse): the aggregator's part of the round, and the round trips of its phases (a masked
    batch is answered while the worker masks the next one, so those overlap)."""
    arms = [("plain", "off"), ("secure, sparse", "sparse")]
    if any("seconds" not in f for _, k in arms for f in d[k]["bytes_by_family"].values()):
        return []
    fams = sorted({f for _, k in arms for f in d[k]["bytes_by_family"]})
    lines = [
        "",
        "Seconds a round the workers' requests took to be answered (the aggregator's part of",
        "the round and each phase's round trip; masked batches are answered while the worker",
        "masks the next one), from the first repeat:",
        "",
        "| mode | " + " | ".join(fams) + " | all | round |",
        "|---|" + "---|" * (len(fams) + 2),
    ]
    for name, key in arms:
        a, rounds = d[key], d["rounds"]
        got = a["bytes_by_family"]
        each = [got[f]["seconds"] / rounds if f in got else 0.0 for f in fams]
        cells = " | ".join(f"{x:.2f}" if x else "-" for x in each)
        round_s = a["seconds_per_round_runs"][0]
        lines.append(f"| {name} | {cells} | {sum(each):.2f} | {round_s:.2f} |")
    return lines


def rows_section() -> list[str]:
    """The rows a round's masks would have to cover (bench/secagg_rows.py), when it has run."""
    d = load_result(ROWS)
    if d is None:
        return []
    lines = [
        "",
        "### The rows a secure round would have to mask",
        "",
        f"Produced by `{as_module(d['command'])}`: cohorts of the default fraction drawn as the",
        "simulator draws them, each client's rows those of its round's samples (positives and 4",
        "uniform negatives per positive). Pairwise masks cancel only where every pair masks",
        "alike, so masks over the rows a round touches must cover the union of its cohort's",
        "rows, and a fixed row budget (with padding that hides each client's own rows) at least",
        "the largest client's.",
        "",
        "| dataset | items | cohort | rows per client | largest client | union of the round "
        "| union / items | union of the positives alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in d["datasets"]:
        lines.append(
            f"| {r['dataset']} | {r['items']} | {r['cohort']} | "
            f"{r['rows_per_client_mean']:.1f} | {r['rows_largest_client_mean']:.0f} | "
            f"{r['union_rows_mean']:.0f} | {100 * r['union_share']:.1f}% | "
            f"{r['positive_union_rows_mean']:.0f} |"
        )
    shares = [100 * r["union_share"] for r in d["datasets"]]
    lines += [
        "",
        f"The uniform negatives spread a cohort over {min(shares):.0f}-{max(shares):.0f}% of the",
        "catalogue: a mask over the union of a round's rows is nearly the dense mask, so it",
        "cannot bring a secure round's bytes near the plain round's. Hence",
        "`secure_aggregation=sparse` above: negatives from a pool shared by the round (the",
        "union shrinks towards the positives' union and the pool) and 32-bit words.",
    ]
    return lines


def _named(m: dict[str, Any]) -> str:
    return f"{100 * m['single_named']:.1f}% ({m['single_suspects']:.1f})"


def union_section() -> list[str]:
    """What the rounds' unions reveal across a run, and cohorts of whole groups
    (bench/secagg_union.py), when it has run."""
    d = load_result(UNION)
    if d is None:
        return []
    marks = [m["round"] for m in d["attack"][0]["clients"]["marks"]]
    lines = [
        "",
        "### What the rounds' unions reveal across a run (`bench/secagg_union.py`)",
        "",
        f"Produced by `{as_module(d['command'])}`. A sparse secure round unmasks how many of its",
        "cohort hold each item outside its public pool (instance A), and lays out the union of",
        "those items in B; a dense round with a pool shows the same union as the nonzero rows",
        "of its sum. The server drew the cohorts, so it can rule out, for every item, each",
        "client that took part in a round whose union lacked it; whoever holds the item is",
        "never ruled out. The cohorts and pools are a default run's (fraction 0.1, fixed-size,",
        f"seed 0, a pool of {d['pool']}); the counts are the protocol's own instance A in the",
        "first rounds (checked equal to the plain count) and the plain count after them.",
        "*Named*: the share of the items held by one user alone for which every other user is",
        "ruled out (in brackets: the users left per such item, on average); *precision*: the",
        "share of the (user, item) pairs left standing that are true. *Groups*: the same",
        f"run with `cohort_groups` = users / {d['group_size']}: each round draws whole groups.",
        "*Dense, no pool*: `secure_aggregation=dense` with negatives drawn from the whole",
        "catalogue, whose sum is nonzero on every row some cohort member's samples touched",
        "(its positives and its uniform negatives, drawn as a training round draws them).",
        "",
        "| dataset | users | items held by one user | cohorts | "
        + " | ".join(f"named after {r} rounds" for r in marks)
        + f" | precision after {marks[-1]} |",
        "|---|---|---|---|" + "---|" * (len(marks) + 1),
    ]
    for a in d["attack"]:
        arms = (
            ("clients", "clients one by one"),
            ("groups", "whole groups"),
            ("dense", "dense, no pool, clients one by one"),
        )
        for arm, label in arms:
            if arm not in a:
                continue
            got = a[arm]
            cells = " | ".join(_named(m) for m in got["marks"])
            arm_label = label
            if got["cohort_groups"]:
                arm_label += f" ({got['cohort_groups']} groups)"
            lines.append(
                f"| {a['dataset']} | {a['users']} | {int(got['marks'][0]['single_items'])} | "
                f"{arm_label}, {got['mean_cohort']:.0f} a round | {cells} | "
                f"{100 * got['marks'][-1]['precision']:.1f}% |"
            )
    acc = d.get("accuracy", [])
    if acc:
        lines += [
            "",
            "What whole groups cost in accuracy (filmtrust, the default preset with the pool,",
            "plain uploads: a secure round's mean is the plain one to within its fixed-point",
            "step; test HR@10 at the round chosen on validation):",
            "",
            "| cohorts | command | HR@10 per seed | mean HR@10 | mean NDCG@10 |",
            "|---|---|---|---|---|",
        ]
        for arm in acc:
            runs = arm["runs"]
            per = ", ".join(f"{100 * r['hr@10']:.2f}" for r in runs)
            lines.append(
                f"| {'whole groups' if arm['cohort_groups'] else 'clients one by one'} | "
                f"`{arm['command']}` | {per} | "
                f"{100 * float(np.mean([r['hr@10'] for r in runs])):.2f} | "
                f"{100 * float(np.mean([r['ndcg@10'] for r in runs])):.2f} |"
            )
    return lines


def prior_section() -> list[str]:
    """The popularity prior a sparse secure run fixes from its rounds' counts
    (bench/secagg_prior.py), when it has run."""
    d = load_result(PRIOR)
    if d is None:
        return []
    lines = [
        "",
        "### The popularity prior under sparse secure aggregation (`bench/secagg_prior.py`)",
        "",
        f"Produced by `{as_module(d['settings']['command'])}`. A sparse secure run ranks with",
        "the prior its rounds' instance A counts fix (the cohorts' items outside each round's",
        "pool, summed until they counted the clients twice over, then scaled to an estimate of",
        "each item's count: `fedrecgel.prior.RoundPrior`): nothing the server did not already",
        "learn. Each run is a plain run of the default preset with the pool of",
        f"{d['settings']['pool']} a sparse run needs (a secure round's mean is the plain one to",
        "within its fixed-point step, and A's counts are the plain counts, so this is what the",
        "secure run serves; a secure round costs about 21 s on Amazon-Video in the simulator,",
        "0.3 s plain).",
        "Test HR@10 (%) at the round chosen on the model's validation HR@10, mean ± std over",
        "the seeds; *model alone*: what a secure run served before (no prior); *exact prior*:",
        "a plain run's ranking at the same round. *Whole groups*: the same with cohorts of",
        f"whole groups of about {d['settings']['group_size']} users (`--cohort-groups`,",
        "users / that), which keep single items' holders from being named (the table above);",
        "their round prior is fixed at the round its counts cover the clients twice over "
        "too." + prior_choice_note(d),
        "",
        "| dataset | pool | seeds | round prior fixed at | model alone | served, round prior "
        "| weights | served, exact prior | weights | whole groups: model alone "
        "| whole groups: served, round prior | weights | popularity |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *prior_rows(d),
    ]
    probes = {f.name: json.loads(f.read_text()) for f in sorted(RES.parent.glob(PROBES))}
    for probe in probes.values():
        lines += prior_rows(probe)
    if probes:
        lines += [
            "",
            "Other pools, probes written apart: "
            + "; ".join(f"`{probe_command(name, p)}`" for name, p in probes.items())
            + ". A secure run's bytes and seconds at each pool: the cost table above.",
        ]
    return lines


def probe_command(name: str, d: dict[str, Any]) -> str:
    """The command that wrote the probe ``d`` to bench/results/``name``: its seeds, pool, and
    the data sets and cohorts its runs hold."""
    runs = d["runs"]
    seeds = ",".join(map(str, d["settings"]["seeds"]))
    sets = ",".join(dict.fromkeys(r["dataset"] for r in runs))
    cohorts = ",".join(dict.fromkeys(r["cohorts"] for r in runs))
    return (
        f"python -m bench.secagg_prior --seeds {seeds} --datasets {sets} --cohorts {cohorts} "
        f"--pool {d['settings']['pool']} --out bench/results/{name}"
    )


def prior_rows(d: dict[str, Any]) -> list[str]:
    """One row a data set of a bench/secagg_prior.py result ``d``."""
    runs, refs, pool = d["runs"], d["references"], d["settings"]["pool"]

    def hr(rs: list[dict[str, Any]], what: str) -> str:
        if not rs:
            return "-"
        got = 100 * np.array([r[what]["hr@10"] for r in rs])
        return f"{got.mean():.2f}" + (f" ± {got.std(ddof=1):.2f}" if len(got) > 1 else "")

    def ws(rs: list[dict[str, Any]]) -> str:
        return ", ".join("-" if r["weight"] is None else f"{r['weight']:g}" for r in rs) or "-"

    lines = []
    for name in dict.fromkeys(r["dataset"] for r in runs):
        by = {
            (c, a): [
                r for r in runs if r["dataset"] == name and r["cohorts"] == c and r["arm"] == a
            ]
            for c in COHORTS
            for a in ARMS
        }
        rd, ex, gr = by["clients", "round"], by["clients", "exact"], by["groups", "round"]
        seeds = ", ".join(str(r["seed"]) for r in rd or gr)
        fixed = ", ".join(str(r["prior_fixed_at"]) for r in rd or gr)
        pop = 100 * refs[name]["popularity"]["hr@10"]
        lines.append(
            f"| {name} | {pool} | {seeds} | {fixed} | {hr(rd, 'model_alone')} | "
            f"{hr(rd, 'served')} | {ws(rd)} | {hr(ex, 'served')} | {ws(ex)} | "
            f"{hr(gr, 'model_alone')} | {hr(gr, 'served')} | {ws(gr)} | {pop:.2f} |"
        )
    return lines
