"""The privacy-utility section of docs/RESULTS.md, from ``bench/results/privacy_utility.json``
(``bench/privacy_utility.py``). Used by ``bench/report.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report_common import load_result
from bench.report_dp_limits import defaults, item_tables, prior_share, spectrum
from fedrecgel.config import current_names

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "privacy_utility.json"
DP_POPULARITY = ROOT / "bench" / "results" / "dp_popularity.json"
DP_SCALE = ROOT / "bench" / "results" / "dp_scale.json"
DP_SCALE_BEFORE = ROOT / "bench" / "results" / "dp_scale_before.json"
DP_NOISE_GROUPS = ROOT / "bench" / "results" / "dp_noise_groups.json"
DP_SIGNAL = ROOT / "bench" / "results" / "dp_signal.json"


def _pm(summary: dict[str, Any], key: str, scale: float = 100.0, digits: int = 2) -> str:
    m, s = summary.get(f"{key}.mean"), summary.get(f"{key}.std")
    if m is None or s is None:
        return "-"
    return f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}"


def section() -> list[str]:
    """Markdown lines of the privacy-utility table (empty without results)."""
    data = load_result(OUT)
    if data is None:
        return []
    lines = [
        "## Privacy-utility of client-level DP",
        "",
        "`bench/privacy_utility.py`: simulated FedRecGEL runs with central DP (each upload",
        "clipped to L2 norm C on the client, Gaussian noise z*C on every coordinate of the",
        "round's sum, mean over the public q*n), Poisson cohort sampling, the noise multiplier",
        "z calibrated by dp-accounting's RDP accountant so that the run's rounds spend the target",
        "epsilon at delta = 1/users; the no-DP row is the same runs without clipping or noise.",
        "Test HR@10 / NDCG@10 (%) at the validation-selected evaluated round, mean ± std over",
        "seeds. The runs are SHORT (the round counts below, chosen for a shared 2-core",
        "machine), so the no-DP row is far from the converged figures of the tables above.",
        "Plot: `docs/privacy_utility.png`.",
        "",
        "| dataset | target epsilon | noise multiplier z | epsilon spent | HR@10 | NDCG@10 "
        "| seeds | settings | popularity, same budget (HR@10) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reference = _dp_popularity_by_cell()
    for name, entry in data.items():
        st = current_names(entry["settings"])
        setting = (
            f"server {st.get('optimizer', 'adam')} lr {st.get('server_lr', 0.001):g}"
            + (f" momentum {st['server_momentum']:g}" if st.get("server_momentum") else "")
            + ", "
            f"{st['rounds']} rounds, q {st['fraction']}, C {st['clip']}, "
            f"eval every {st['eval_every']}, {entry['n_users']} users"
        )
        summ = entry.get("summary", {})
        order = ["none", *sorted((t for t in summ if t != "none"), key=float)]
        for t in order:
            if t not in summ:
                continue
            s = summ[t]
            lines.append(
                f"| {entry.get('dataset', name)} | {'no DP' if t == 'none' else t} "
                f"| {_pm(s, 'noise_multiplier', 1.0, 3) if t != 'none' else '-'} "
                f"| {_pm(s, 'epsilon', 1.0, 3) if t != 'none' else '-'} "
                f"| {_pm(s, 'hr@10')} | {_pm(s, 'ndcg@10')} | {s['seeds']} | {setting} "
                f"| {reference.get((_with_protocol(entry.get('dataset', name)), _eps(t)), '-')} |"
            )
    measured = {entry.get("dataset", name) for name, entry in data.items()}
    missing = [d for d in ("filmtrust", "amazon-video", "lastfm-2k/clean") if d not in measured]
    if missing:
        lines += ["", f"Not measured yet: {', '.join(missing)}."]
    lines += [
        "",
        "With about 120 clients per round, noise of std z*C lands on each of the ~370,000",
        "shared coordinates. A server Adam divides each coordinate's step by that coordinate's",
        "own running size, so on the many coordinates where the round's signal is smaller than",
        "the noise it takes a full step of noise: with Adam the DP runs rank at the level of a",
        "random ranking (HR@10 about 10% with 100 candidates). A server SGD keeps each step in",
        "proportion to signal plus noise, and the noise averages out over rounds: the `sgd`",
        "rows (step size 3, chosen over 1, 3 and 10 on seed 0's validation HR@10 at 20 rounds,",
        "reported seeds 1-3) are what DP costs with a suitable server optimizer. Curves still",
        "rise at the last round: longer runs spend more budget per round count, so the best",
        "round count for a budget is a further choice not tuned here. On FilmTrust a plain",
        "popularity ranking (91.2, the dotted line in the plot) stays above every row here,",
        "the no-DP one included: these runs measure what DP costs at a fixed training budget,",
        "not a model better than popularity. On Amazon-Video the FilmTrust step does not",
        "learn within 50 rounds even without DP (the amazon-video rows, two seeds, about 13%",
        "against popularity's 60.2); a probe with server fedadam (step 0.01, seed 0, 50 rounds,",
        "validation HR@10) reached 34.4 without DP and 14.6 at epsilon 3. A DP setting that",
        "learns on Amazon-Video is not found yet (the `momentum 0.9` setting below: 11.1",
        "validation HR@10 at epsilon 3 after 50 rounds, seed 100).",
        "",
        "The `momentum 0.9` rows clip each upload to C = 0.25 (the median upload norm of the",
        "100,000-user set below; noise z*C four times smaller than at C = 1), server SGD step 1.2,",
        "momentum 0.9: the setting the 100,000-user bench below chose on its tuning seed; on",
        "FilmTrust's tuning seed (100, epsilon 3, best validation HR@10) it reached 86.5 in 50",
        "rounds and 85.6 in 100, against 86.1 with step 2.4 and 85.9 with C = 0.1 and step 3.",
        "Epsilon 3 then costs 0.4 points against the same setting without noise (86.91 against",
        "87.34), against 8.8 for the step-3 rows; the setting itself, without DP, stays below",
        "the tuned non-private model (92.99 in the accuracy table) and below DP popularity.",
        "Epsilon 8's mean carries one seed (1) at 75.4 at its validation-selected round (seeds",
        "2 and 3: 86.7 and 87.1).",
    ]
    tail = [dp_popularity(), defaults(), prior_share(), dp_scale(), item_tables(), signal()]
    return lines + [line for part in tail for line in part] + spectrum()


def _eps(target: str) -> str:
    return target if target == "none" else f"{float(target):g}"


def _with_protocol(dataset: str) -> str:
    return dataset if "/" in dataset else f"{dataset}/paper"


def _dp_popularity_by_cell() -> dict[tuple[str, str], str]:
    """(data set/protocol, epsilon as the privacy-utility JSON writes it) -> the DP
    popularity's test HR@10 at the validation-chosen k, for the privacy-utility table."""
    data = load_result(DP_POPULARITY)
    if data is None:
        return {}
    out = {}
    for name, entry in data["datasets"].items():
        out[(name, "none")] = _pm(entry["popularity"], "hr@10") + " (no DP)"
        for eps, cell in entry["epsilons"].items():
            out[(name, _eps(eps))] = _pm(cell["tuned"], "hr@10")
    return out


def dp_popularity() -> list[str]:
    """The private popularity baseline (``bench/dp_popularity.py``) beside the DP rows."""
    data = load_result(DP_POPULARITY)
    if data is None:
        return []
    st = data["settings"]
    lines = [
        "",
        "### The private reference point: popularity under the same budget "
        "(`bench/dp_popularity.py`)",
        "",
        "`fedrec train --method popularity --target-epsilon E`: each user counts at most k of "
        "its distinct training items, Gaussian noise of std z*sqrt(k) on every item's count, "
        "one release, z calibrated by the same RDP accountant at delta = 1/users. k chosen per "
        f"cell on validation HR@10 of seed {st['tuning_seed']} from {st['k_grid']}; test HR@10 "
        f"(%) mean ± std over seeds {st['seeds']}; *default k*: the shipped "
        f"--dp-max-items {st['shipped_default_k']}. A federated DP row above is useful only "
        "above this one at the same epsilon.",
        "",
        "| dataset | epsilon | k (validation) | z | HR@10 | HR@10 at the default k | "
        "plain popularity |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in data["datasets"].items():
        for eps, cell in entry["epsilons"].items():
            tuned, default = cell["tuned"], cell["default"]
            lines.append(
                f"| {name} | {eps} | {tuned['k']} | {tuned['noise_multiplier']:.2f} | "
                f"{_pm(tuned, 'hr@10')} | {_pm(default, 'hr@10')} | "
                f"{_pm(entry['popularity'], 'hr@10')} |"
            )
    return lines


def dp_scale() -> list[str]:
    """Client-level DP at 100,000 users (``bench/dp_scale.py``) against the same run without
    DP and popularity under the same budget."""
    data = load_result(DP_SCALE)
    if data is None:
        return []
    st, ds = data["settings"], data["dataset"]
    rows, refs = data["rows"], data["dp_popularity"]
    nodp = rows["no DP"]["figures"]
    lines = [
        "",
        "### Where user-level DP is meaningful: 100,000 users (`bench/dp_scale.py`)",
        "",
        f"The synthetic taste groups ({ds['groups']} groups, affinity {ds['affinity']}) at "
        f"{ds['users']:,} users and {ds['n_items']} items; {st['rounds']} rounds, Poisson "
        f"cohorts of fraction {st['fraction']} (about {st['fraction'] * ds['users']:,.0f} "
        f"clients a round), evaluated every {st['eval_every']}; test HR@10 / NDCG@10 (%) at the "
        f"validation-selected round, mean ± std over seeds {st['seeds']}. *No DP*: the shipped "
        "default preset; *DP*: uploads clipped to C = "
        f"{st['dp_clip']:g}, noise calibrated to the epsilon over the run's rounds at delta = "
        f"1/users, server SGD step {st['dp_server_lr']:g}"
        + (f" with momentum {st['dp_momentum']:g}" if st.get("dp_momentum") else "")
        + (
            f" (chosen over {sorted(data['tuning']['best_validation_hr@10_by_lr'])} on seed "
            f"{data['tuning']['seed']}'s validation HR@10)"
            if data.get("tuning")
            else " (the bench's default, from a probe on the tuning seed: its docstring)"
        )
        + f". Popularity on this split: {100 * data['popularity']['hr@10']:.2f}.",
        "",
        "| run | epsilon spent | HR@10 | NDCG@10 | below no DP (points) | target | met | "
        "DP popularity (k) |",
        "|---|---|---|---|---|---|---|---|",
        f"| no DP | - | {_pm(nodp, 'hr@10')} | {_pm(nodp, 'ndcg@10')} | | | | |",
    ]
    for eps, row in rows.items():
        if eps == "no DP":
            continue
        spent = max(r["epsilon_spent"] or 0.0 for r in row["runs"])
        t, ref = data["targets"][eps], refs[eps]
        met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
        lines.append(
            f"| DP, epsilon {eps} | {spent:.2f} | {_pm(row['figures'], 'hr@10')} | "
            f"{_pm(row['figures'], 'ndcg@10')} | {t['points_below_no_dp']:.2f} | "
            f"<= {t['allowed']} | {met} | {_pm(ref, 'hr@10')} ({ref['k']}) |"
        )
    lines += _dp_scale_before(rows)
    chosen = sorted({r["selected"]["round"] for row in rows.values() for r in row["runs"]})
    last = st["rounds"]
    lines += [
        "",
        f"Validation selected round(s) {', '.join(map(str, chosen))} of {last}"
        + (
            ": every run, the no-DP one too, was still rising at its last round. At about "
            f"{st['rounds'] * st['fraction']:g} visit(s) per user the no-DP model is only "
            f"{100 * nodp['hr@10.mean'] - 100 * data['popularity']['hr@10']:.2f} points above "
            "popularity; the gap DP leaves is measured here against a model that has not "
            "converged, and longer runs are the next measurement."
            if chosen == [last]
            else "."
        ),
    ]
    return lines


def _dp_scale_before(rows: dict[str, Any]) -> list[str]:
    """The same rows as first measured (``dp_scale_before.json``: C = 1, no momentum), when
    kept: what the clip norm and the server's momentum changed."""
    old = load_result(DP_SCALE_BEFORE)
    if old is None:
        return []
    st = old["settings"]
    how = (
        f"C = {st['dp_clip']:g}, server SGD step {st['dp_server_lr']:g}, "
        f"momentum {st.get('dp_momentum', 0.0):g}"
    )
    out = ["", *noise_groups(), "", f"Before (the same bench with {how}; test HR@10):", ""]
    for eps, row in old["rows"].items():
        if eps in rows:
            name = "no DP" if eps == "no DP" else f"epsilon {eps}"
            out.append(
                f"* {name}: {_pm(row['figures'], 'hr@10')} then, "
                f"{_pm(rows[eps]['figures'], 'hr@10')} now"
            )
    return out


def noise_groups() -> list[str]:
    """Where the noise costs accuracy (``bench/dp_noise_groups.py``), when it has run."""
    d = load_result(DP_NOISE_GROUPS)
    if d is None:
        return []
    st = d["settings"]
    best = {r["arm"]: r for r in d["runs"]}
    what = {
        "clipped": "clipped, no noise",
        "network": "the noise on the score network only",
        "items": "the noise on the item tables only",
    }
    out = [
        f"Where the noise costs (`bench/dp_noise_groups.py`, a diagnosis, not DP): the no-DP "
        f"preset (server Adam) on the tuning seed {st['seed']}, uploads clipped to "
        f"C = {st['clip']:g}, with the noise of the epsilon-{st['epsilon']:g} run put on parts "
        "of the model only; best validation HR@10 over the run's rounds (round):",
        "",
    ]
    for arm, label in what.items():
        if arm in best:
            r = best[arm]
            at = max(r["curve"], key=lambda c: c["val_hr@10"])["round"]
            out.append(f"* {label}: {100 * r['best_val_hr@10']:.2f} ({at})")
    out += [
        "",
        "Clipping costs the preset nothing and the noise on the score network little: what "
        "holds every DP run at popularity's level is the noise on the item tables, whatever "
        "the server optimizer (server Adam at epsilon 8: 32.34 on the same seed; the probes "
        "that did not move it are in `bench/dp_scale.py`'s docstring). At small sampling "
        "rates the calibrated noise on a round's mean hardly depends on the cohort fraction, "
        "so a larger cohort does not lower it either (twice the fraction, 2%: 32.35). More "
        "users at the same cohort size should, as the accountant's noise multiplier falls "
        "with the sampling rate (not measured here).",
    ]
    return out


def signal() -> list[str]:
    """Each data set's round signal against its DP noise (``bench/dp_signal.py``)."""
    d = load_result(DP_SIGNAL)
    if d is None:
        return []
    st = d["settings"]
    lines = [
        "",
        "### Why DP stays at popularity's level: signal against noise (`bench/dp_signal.py`)",
        "",
        "A measurement, not a private run: each data set's DP setting (the shipped default "
        f"preset's client settings, uploads clipped to C = {st['clip']:g}, server SGD step 1.2 "
        "with momentum 0.9, as in `bench/dp_scale.py`; Poisson cohorts, seed "
        f"{st['seed']}) with the noise multiplier z the accountant calibrates for epsilon "
        f"{st['epsilon']:g} at delta = 1/users, but the noise is measured instead of added. "
        "*Signal*: the norm of a round's clipped mean over the cohort, for the two item "
        "tables together and for the score network (median over the rounds); *noise*: the "
        "norm of the noise the DP run puts on it (z*C over the expected cohort, on every "
        "coordinate). *Over the run*: the sum of the rounds' means against the sum of their "
        "noises (what a server SGD without momentum integrates). *Rows above noise*: the "
        "share of item-table rows whose signal row is longer than its noise row; *along*: "
        "longer than the noise in one fixed direction (a popularity direction read from "
        "the rows). *Ceiling*: the best validation HR@10 of the same run without noise, and "
        "the popularity ranking's on the same split.",
        "",
        "| data set | users | items | q | rounds | z | noise std on the mean | item signal / "
        "noise, a round | over the run | item rows above noise, over the run (along) | "
        "network signal / noise, a round | over the run | ceiling (val HR@10) | popularity "
        "(val HR@10) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["runs"]:
        m, o = r["per_round_median"], r["over_the_run"]
        lines.append(
            f"| {r['dataset']} | {r['users']:,} | {r['items']:,} | {r['fraction']:g} | "
            f"{r['rounds']} | {r['noise_multiplier']:.2f} | {r['noise_std_of_the_mean']:.1e} | "
            f"{m['item_signal'] / m['item_noise']:.4f} | "
            f"{o['item_signal'] / o['item_noise']:.3f} | "
            f"{100 * o['rows_above_noise']:.1f}% ({100 * o['rows_above_noise_along']:.1f}%) | "
            f"{m['network_signal'] / m['network_noise']:.3f} | "
            f"{o['network_signal'] / o['network_noise']:.3f} | "
            f"{100 * r['best_val_hr@10_without_noise']:.2f} | "
            f"{_pct(r.get('popularity_val_hr@10'))} |"
        )
    by = {r["dataset"]: r for r in d["runs"]}
    real = [r for n, r in by.items() if not n.startswith("synthetic")]
    big = by.get("synthetic-tastes-100k")
    if not real or big is None:
        return lines
    worst = max(o["over_the_run"]["item_signal"] / o["over_the_run"]["item_noise"] for o in real)
    bo = big["over_the_run"]
    lines += [
        "",
        "Reading: on the three real data sets the item tables' signal, summed over the whole "
        f"run, is at most {worst:.3f} of the noise summed over the same rounds, and "
        + (
            "no item row's signal outgrows its noise"
            if not max(o["over_the_run"]["rows_above_noise"] for o in real)
            else f"at most {100 * max(o['over_the_run']['rows_above_noise'] for o in real):.1f}% "
            "of the item rows' signals outgrow their noise"
        )
        + "; along one fixed direction at most "
        f"{100 * max(o['over_the_run']['rows_above_noise_along'] for o in real):.1f}% of the rows "
        "do. The DP model's item tables are noise there, whatever the server optimizer does "
        "with them, and what it ranks by comes from the score network and the private user "
        "embeddings. At 100,000 users the noise on a round's mean is "
        f"{by[real[0]['dataset']]['noise_std_of_the_mean'] / big['noise_std_of_the_mean']:.0f}x "
        f"smaller than on {real[0]['dataset']}, the item signal over the run is "
        f"{bo['item_signal'] / bo['item_noise']:.2f} of the noise and "
        f"{100 * bo['rows_above_noise']:.1f}% of the rows rise above it "
        f"({100 * bo['rows_above_noise_along']:.1f}% along one direction): enough for the "
        "popularity plateau (the DP rows above tie DP popularity there), not for tastes.",
    ]
    below = [
        r["dataset"]
        for r in d["runs"]
        if r.get("popularity_val_hr@10") is not None
        and r["best_val_hr@10_without_noise"] <= r["popularity_val_hr@10"] + 0.005
    ]
    if below:
        lines[-1] += (
            " The ceilings show a second limit: without any noise this server SGD stays within "
            f"half a point of popularity or below it on {', '.join(below)}; the server Adam "
            "that learns more without noise takes a full step of noise on every coordinate "
            "whose signal is below the noise."
        )
    return lines


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"
