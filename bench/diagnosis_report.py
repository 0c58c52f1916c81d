"""docs/RESULTS.md sections of the accuracy diagnosis (``bench/accuracy_diagnosis.py``), the
default settings' grid and leave-one-dataset-out check (``bench/default_rule.py``), and the
targets of the defaults against popularity and centralized training. Used by
``bench/report.py``."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, cast

from bench.accuracy_report import _pm, _vals, cell, central, shipped
from bench.report_common import load_result
from fedrecgel.config import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
DIAGNOSIS = RES / "diagnosis.json"
SCORE_NETWORK = RES / "score_network_diagnosis.json"
#: the rounds the score-network table shows
SHOWN_LONG = (10, 50, 100, 150, 200, 250, 300)
RULE = RES / "default_rule"
#: the rounds the diagnosis table shows
SHOWN = (10, 50, 100, 200)
#: the data sets of the targets (accuracy-table keys)
TARGET_KEYS = ("filmtrust/paper", "amazon-video/paper", "lastfm-2k/clean", "synthetic-tastes/paper")


def _plot(key: str, runs: dict[str, Any], panels: tuple[tuple[str, str], ...], prefix: str) -> str:
    """One figure per data set: the validation HR@10 of the real users and of the mean user,
    then one panel per ``(instrument, title)``; saved as ``<prefix>_<key>.png`` in docs/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(4 * (1 + len(panels)), 3.4))
    for label, run in runs.items():
        rows = run["rounds"]
        r = [x["round"] for x in rows]
        (line,) = axes[0].plot(r, [100 * x["val_hr"] for x in rows], label=f"{label}: real users")
        axes[0].plot(
            r,
            [100 * x["val_hr_mean_user"] for x in rows],
            "--",
            color=line.get_color(),
            label=f"{label}: every user = the mean user",
        )
        for ax, (field, _) in zip(axes[1:], panels, strict=True):
            ax.plot(r, [x[field] for x in rows], color=line.get_color(), label=label)
    titles = ("validation HR@10 (%)", *(title for _, title in panels))
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.legend(fontsize=7)
    fig.suptitle(key, fontsize=10)
    fig.tight_layout()
    name = f"{prefix}_{key.replace('/', '_')}.png"
    fig.savefig(DOCS / name, dpi=80)
    plt.close(fig)
    return name


#: the diagnosis plot's panels after the first
DIAGNOSIS_PANELS = (
    ("item_share", "logit variance explained by the mean user"),
    ("user_cos_mean", "cosine of user embeddings to their mean"),
    ("neg_share", "share of upload on sampled negatives"),
)
#: the score-network plot's panels after the first
SCORE_NETWORK_PANELS = (
    ("tower_norm", "norm of the score network's weights"),
    ("logit_spread", "spread of a user's candidate logits"),
)


def diagnosis() -> list[str]:
    """What the instruments measured, per data set, with plots."""
    data = load_result(DIAGNOSIS)
    if data is None:
        return []
    lines = [
        "## Why the federated model ranked like a popularity count (`bench/accuracy_diagnosis.py`)",
        "",
        f"Tuning seed {data['seed']}, validation items only, instruments every 10 rounds. "
        "*mean-user HR*: validation HR@10 with every user's private embeddings replaced by the "
        "population's mean (a ranking that knows nothing of the user); *item share*: the share "
        "of the within-user variance of the candidates' logits that the mean user's logits "
        "explain (1: all users rank alike); *cos*: mean cosine of the users' GMF embeddings "
        "to their mean; *steps*: private Adam steps per user so far; *neg share*: share of the "
        "squared item-row upload norm on the sampled negatives (64 cohort members); *move*: "
        "item GMF table's distance from its initial value, relative; *max step*: the largest "
        "change of an item entry in the round. *paper*: the reference code's settings; "
        "*default*: the default preset when this was measured (server Adam 0.003, 5 private "
        "local steps at client lr 0.01; it has since gained the score network's weight decay "
        "and a larger server step, next section).",
        "",
    ]
    for key, runs in data["datasets"].items():
        lines += [
            f"### {key}",
            "",
            "| settings | round | val HR@10 | mean-user HR@10 | item share | cos | steps | "
            "neg share | move | max step | spearman vs popularity |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, run in runs.items():
            for x in run["rounds"]:
                if x["round"] not in SHOWN:
                    continue
                lines.append(
                    f"| {label} | {x['round']} | {100 * x['val_hr']:.2f} | "
                    f"{100 * x['val_hr_mean_user']:.2f} | {x['item_share']:.3f} | "
                    f"{x['user_cos_mean']:.3f} | {x['user_steps']:.1f} | {x['neg_share']:.3f} | "
                    f"{x['move']['item_gmf']:.2f} | {x['max_step']:.4f} | {x['spearman_pop']:.3f} |"
                )
        lines += [
            "",
            f"![diagnosis {key}]({_plot(key, runs, DIAGNOSIS_PANELS, 'diagnosis')})",
            "",
            *_reading(key, runs),
            "",
        ]
    return lines


def score_network() -> list[str]:
    """The score network's weights along a run, with and without the server's weight decay."""
    data = load_result(SCORE_NETWORK)
    if data is None:
        return []
    lines = [
        "## Why the validation figure fell after its peak (`bench/score_network_diagnosis.py`)",
        "",
        f"Tuning seed {data['seed']}, validation items only, {data['rounds']} rounds, the "
        "default preset's settings before the server's weight decay existed (server Adam "
        "0.003, 5 private local steps at client lr 0.01), without and with "
        "`server_weight_decay` (decoupled decay of the score network's weight matrices at "
        "each server step). *tower norm*: Frobenius norm of the score network's weight "
        "matrices; *item norm*: of the item tables; *logit spread*: mean over users of the "
        "standard deviation of the 100 candidates' logits.",
        "",
    ]
    for key, runs in data["datasets"].items():
        lines += [
            f"### {key}",
            "",
            "| settings | round | val HR@10 | mean-user HR@10 | tower norm | item norm | "
            "logit spread | training loss |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, run in runs.items():
            for x in run["rounds"]:
                if x["round"] in SHOWN_LONG:
                    lines.append(
                        f"| {label} | {x['round']} | {100 * x['val_hr']:.2f} | "
                        f"{100 * x['val_hr_mean_user']:.2f} | {x['tower_norm']:.1f} | "
                        f"{x['item_norm']:.1f} | {x['logit_spread']:.2f} | {x['loss']:.3f} |"
                    )
        lines += [
            "",
            f"![score network {key}]({_plot(key, runs, SCORE_NETWORK_PANELS, 'score_network')})",
            "",
        ]
        for label, run in runs.items():
            hr, at = _peak(run)
            last = run["rounds"][-1]
            first = run["rounds"][0]
            lines.append(
                f"- {label}: peak {hr:.2f} at round {at}, {100 * last['val_hr']:.2f} at "
                f"round {last['round']} ({100 * last['val_hr'] - hr:+.2f}); the score "
                f"network's weights went from norm {first['tower_norm']:.1f} at round "
                f"{first['round']} to {last['tower_norm']:.1f}, the training loss from "
                f"{first['loss']:.3f} to {last['loss']:.3f}."
            )
        lines.append("")
    return lines


def _at(run: dict[str, Any], round_: int) -> dict[str, Any]:
    """The instruments at ``round_`` (or the last measured before it)."""
    rows: list[dict[str, Any]] = [x for x in run["rounds"] if x["round"] <= round_]
    return rows[-1]


def _personal_from(run: dict[str, Any], points: float = 1.0) -> int | None:
    """The first measured round (from round 10: round 1 is noise around an untrained model)
    where the real users beat the mean user by ``points``."""
    for x in run["rounds"]:
        if x["round"] >= 10 and 100 * (x["val_hr"] - x["val_hr_mean_user"]) >= points:
            return int(x["round"])
    return None


def _peak(run: dict[str, Any]) -> tuple[float, int]:
    best = max(run["rounds"], key=lambda x: x["val_hr"])
    return 100 * best["val_hr"], int(best["round"])


def _reading(key: str, runs: dict[str, Any]) -> list[str]:
    """What the instruments of one data set say, in numbers taken from them."""
    if not {"paper", "default"} <= set(runs):
        return []
    p100, d100 = _at(runs["paper"], 100), _at(runs["default"], 100)
    early = [x for x in runs["paper"]["rounds"] if 10 <= x["round"] <= 100]
    gap = max(100 * (x["val_hr"] - x["val_hr_mean_user"]) for x in early)

    def when(label: str) -> str:
        r = _personal_from(runs[label]) if label in runs else None
        return "no round" if r is None else f"round {r}"

    text = (
        f"Reading ({key}): at the paper's settings, up to round 100 (the paper's budget) the "
        f"real users rank the validation items at most {gap:.2f} points above the mean user "
        f"(round 100: the mean user explains {p100['item_share']:.1%} of the logit variance, "
        f"cosine to the mean {p100['user_cos_mean']:.2f}): what has been learned is one "
        f"ranking for everyone, close to popularity (rank correlation "
        f"{p100['spearman_pop']:.2f} with the training counts). The first round where the "
        f"real users beat the mean user by a point: {when('paper')} at the paper's settings"
    )
    s100 = None
    if "paper, server step 0.01" in runs:
        s100 = _at(runs["paper, server step 0.01"], 100)
        peak, at = _peak(runs["paper, server step 0.01"])
        end = 100 * runs["paper, server step 0.01"]["rounds"][-1]["val_hr"]
        text += (
            f", {when('paper, server step 0.01')} with a 10x server step (which peaks at "
            f"{peak:.2f} at round {at} and is at {end:.2f} by the last round)"
        )
    dpeak, dat = _peak(runs["default"])
    text += (
        f", {when('default')} at the defaults (peak {dpeak:.2f} at round {dat}). By round "
        f"100 the item GMF table has moved {p100['move']['item_gmf']:.2f} of its initial norm "
        f"at the paper's step"
        + (f", {s100['move']['item_gmf']:.2f} at the 10x step" if s100 else "")
        + f" and {d100['move']['item_gmf']:.2f} at the defaults; a user has taken "
        f"{p100['user_steps']:.1f} private Adam steps at the paper's settings (one per "
        f"participation) and {d100['user_steps']:.1f} at the defaults. Sampled negatives carry "
        f"{p100['neg_share']:.0%} of an upload's item-row norm at round 100 (paper), "
        f"{d100['neg_share']:.0%} at the defaults."
    )
    return [text]


def _rule_rows(part: str) -> list[dict[str, Any]]:
    """The rows of ``part`` (``grid`` or ``check``) of every default-rule result, in file order."""
    rows: list[dict[str, Any]] = []
    for path in sorted(RULE.glob("*.json")):
        rows += json.loads(path.read_text())[part].values()
    return rows


def _acc_key(ds: str) -> str:
    return ds if "/" in ds else f"{ds}/paper"


def _central_hr(key: str) -> float | None:
    cen = central(key)
    if not cen or "selected" not in cen:
        return None
    return 100 * float(cen["selected"]["hr@10"]["mean"])


def default_rule() -> list[str]:
    """The grid and the leave-one-dataset-out table."""
    grid = _rule_rows("grid")
    if not grid:
        return []
    datasets = sorted({r["dataset"] for r in grid})
    candidates = list(dict.fromkeys(r["candidate"] for r in grid))
    by = {(r["dataset"], r["candidate"]): r for r in grid}
    lines = [
        "## The default settings, chosen across data sets (`bench/default_rule.py`)",
        "",
        "Each candidate trained on every data set on the tuning seed (100), on a split whose test "
        "candidates are the validation ones: no test item is ranked. Cell: best validation "
        "HR@10 (every 10 rounds) minus popularity's on the same validation items, in points. "
        "The rule: the candidate with the highest mean over the data sets. All runs take the "
        f"default radii ({DEFAULTS.rho_sh:g} / {DEFAULTS.rho_ns:g}), as a data set without a "
        "preset gets.",
        "",
        "| candidate | " + " | ".join(datasets) + " | mean |",
        "|---|" + "---|" * (len(datasets) + 1),
    ]
    for c in candidates:
        vals = [100 * by[(d, c)]["score"] if (d, c) in by else None for d in datasets]
        got = [v for v in vals if v is not None]
        mean = f"{statistics.fmean(got):+.2f}" if len(got) == len(datasets) else "-"
        lines.append(
            f"| {c} | "
            + " | ".join("-" if v is None else f"{v:+.2f}" for v in vals)
            + f" | {mean} |"
        )
    checks = _rule_rows("check")
    if checks:
        lines += [
            "",
            "### Leave one data set out",
            "",
            "For each data set, the rule applied to the *other* data sets' grid picks the "
            "settings; they train on the left-out set at the reported seeds 0, 1, 2 "
            "(validation-selected test HR@10, mean ± std). Target: popularity + 5 wherever the "
            "centralized NCF is at least popularity + 10. `synthetic-holdout` "
            "(`bench/accuracy_diagnosis.py` SYNTHETIC_HOLDOUT: MovieLens-100K's shape with "
            "taste groups) was in no grid: nothing about it shaped the defaults.",
            "",
            "| left out | picked without it | seeds | selected test HR@10 | popularity | "
            "centralized NCF | gain over popularity | target |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for ds in sorted({r["dataset"] for r in checks}, key=lambda d: (d not in datasets, d)):
            rows = [r for r in checks if r["dataset"] == ds]
            if not rows:
                continue
            vals = [100 * r["selected"]["hr@10"] for r in rows]
            pop = 100 * rows[0]["popularity"]["hr@10"]
            cen = _central_hr(_acc_key(ds))
            gain = statistics.fmean(cast(list[float], vals)) - pop
            if cen is None:
                verdict = "no centralized figure"
            elif cen < pop + 10:
                verdict = f"not set (centralized only {cen - pop:+.2f} over popularity)"
            else:
                verdict = "met" if gain >= 5 else "missed"
            name = ds if ds in datasets else f"{ds} (in no grid: never seen)"
            lines.append(
                f"| {name} | {rows[0]['candidate']} | {len(rows)} | {_pm(cast(list[float], vals))} | {pop:.2f} | "
                f"{'-' if cen is None else f'{cen:.2f}'} | {gain:+.2f} | {verdict} |"
            )
    return lines


def _mean(key: str, label: str) -> tuple[float | None, int]:
    vals = _vals(cell(key, label), "selected", "hr@10")
    return (statistics.fmean(vals) if vals else None), len(vals)


def targets() -> list[str]:
    """The defaults against centralized NCF and popularity, per data set."""
    lines = [
        "### Targets of the defaults (validation-selected test HR@10, mean over seeds, points)",
        "",
        "| data set | defaults (seeds) | popularity | centralized | >= centralized - 2 | "
        ">= popularity + half the gap | FedRecGEL - FedNCF at the defaults (p) |",
        "|---|---|---|---|---|---|---|",
    ]
    from scipy.stats import ttest_rel

    for key in TARGET_KEYS:
        fed, n = _mean(key, "default-fedrecgel")
        pop, _ = _mean(key, "popularity")
        cen = _central_hr(key)
        if fed is None or pop is None:
            continue
        t1 = "-" if cen is None else ("met" if fed >= cen - 2 else "missed")
        t2 = "-" if cen is None else ("met" if fed >= pop + (cen - pop) / 2 else "missed")
        a = {r["seed"]: 100 * r["selected"]["hr@10"] for r in cell(key, "default-fedrecgel")}
        b = {r["seed"]: 100 * r["selected"]["hr@10"] for r in cell(key, "default-fedncf")}
        seeds = sorted(set(a) & set(b))
        sam = "-"
        if len(seeds) >= 2:
            x, y = [a[s] for s in seeds], [b[s] for s in seeds]
            sam = f"{statistics.fmean(x) - statistics.fmean(y):+.2f} (p = {ttest_rel(x, y).pvalue:.3f})"
        lines.append(
            f"| {key} | {fed:.2f} ({n}) | {pop:.2f} | {'-' if cen is None else f'{cen:.2f}'} | "
            f"{t1} | {t2} | {sam} |"
        )
    return lines


def tuned_targets() -> list[str]:
    """The same targets at ``--preset tuned``: a data set's own preset (chosen by its study
    on validation items only), else the defaults; cells run with a preset since withdrawn
    are left out (they are not what ``--preset tuned`` gives)."""
    rows = []
    for key in TARGET_KEYS:
        runs = cell(key, "tuned-fedrecgel")
        source = runs[0]["settings_from"] if runs else ""
        if source.startswith("tuned-") and source not in shipped():
            continue
        fed = statistics.fmean(_vals(runs, "selected", "hr@10")) if runs else None
        pop, _ = _mean(key, "popularity")
        cen = _central_hr(key)
        if fed is None or pop is None or cen is None:
            continue
        t1 = "met" if fed >= cen - 2 else "missed"
        t2 = "met" if fed >= pop + (cen - pop) / 2 else "missed"
        rows.append(
            f"| {key} | {source} | {fed:.2f} ({len(runs)}) | {pop:.2f} | {cen:.2f} | {t1} | {t2} |"
        )
    if not rows:
        return []
    return [
        "### Targets at `--preset tuned` (validation-selected test HR@10, points)",
        "",
        "*preset*: the data set's own `tuned-<dataset>`, or `default` where it has none (its "
        "study did not beat the default on validation, or it has no study).",
        "",
        "| data set | preset | tuned (seeds) | popularity | centralized | "
        ">= centralized - 2 | >= popularity + half the gap |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def val_test_gap() -> list[str]:
    """How far each method's validation HR@10 sits above its test HR@10 (mean over the
    evaluated rounds from 50 on and over seeds; popularity: its one ranking), per data set:
    where a method's gap exceeds popularity's, settings chosen on validation beat popularity
    there by more than they do on test."""
    labels = ("popularity", "faithful", "default-fedrecgel", "tuned-fedrecgel")
    rows, wider = [], []
    for key in TARGET_KEYS:
        gaps: dict[str, float] = {}
        for label in labels:
            diffs = [
                p["val_hr@10"] - p["test_hr@10"]
                for r in cell(key, label)
                for p in r["curve"]
                if label == "popularity" or p["round"] >= 50
            ]
            if diffs:
                gaps[label] = 100 * statistics.fmean(diffs)
        if "popularity" not in gaps:
            continue
        cells = [f"{gaps[lab]:+.2f}" if lab in gaps else "-" for lab in labels]
        excess = gaps.get("default-fedrecgel", math.nan) - gaps["popularity"]
        rows.append(f"| {key} | {' | '.join(cells)} | {excess:+.2f} |")
        if excess > 0.5:
            wider.append(f"{key} ({excess:+.2f})")
    if not rows:
        return []
    reading = (
        f"The defaults' gap exceeds popularity's by more than half a point on {', '.join(wider)}:"
        " there their lead over popularity on the validation items shrinks on the test items,"
        " so settings chosen on validation can rank above popularity on validation and below"
        " it on test."
        if wider
        else "On no data set does the defaults' gap exceed popularity's by more than half a point."
    )
    return [
        "### Validation against test (validation HR@10 minus test HR@10, points)",
        "",
        "Mean over the evaluated rounds from round 50 on and over seeds 0-2 (popularity: its "
        "one ranking). The validation item is each user's second-latest interaction, the test "
        "item the latest.",
        "",
        "| data set | popularity | faithful | defaults | tuned | defaults' gap - popularity's |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        reading,
    ]


def section() -> list[str]:
    """Everything this module reports."""
    out = diagnosis()
    out += score_network()
    rule = default_rule()
    if rule:
        out += ["", *rule, "", *targets()]
    tuned = tuned_targets()
    if tuned:
        out += ["", *tuned]
    gap = val_test_gap()
    if gap:
        out += ["", *gap]
    return out
