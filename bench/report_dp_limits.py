"""Two subsections of docs/RESULTS.md's privacy section: what DP at the defaults gives
(``bench/dp_defaults.py``) and what item structure survives one private release at all
(``bench/dp_spectrum.py``). Used by ``bench/privacy_report.py``."""

from __future__ import annotations

import statistics
from typing import Any

from bench.dp_scale import DP_CLIP
from bench.report_common import load_result, mean_std, prior_choice_note, runs_by


def defaults() -> list[str]:
    """`fedrec train --target-epsilon E` with no preset, before and after the private preset."""
    d: dict[str, Any] | None = load_result("dp_defaults.json")
    if d is None:
        return []
    st = d["settings"]
    lines = [
        "",
        "### DP at the defaults: the private preset (`bench/dp_defaults.py`)",
        "",
        f"`fedrec train --target-epsilon {st['epsilon']:g}` with no preset named: *before*, the "
        "default preset (server Adam, 300 rounds, C = 1, fixed-size cohorts); now, the "
        "`private` preset (server SGD step 1.2 with momentum 0.9, 50 rounds, Poisson cohorts, "
        "the clip norm adapting towards the median upload norm from 0.1: "
        "`--dp-clip-quantile 0.5`, Andrew et al. 2021; measured before the preset took "
        "`dp_prior_share`: its prior is the next table); between them, the private preset "
        "with the clip norm fixed by hand. Test HR@10 (%) at the validation-selected round, "
        f"mean ± std over seeds {st['seeds']}; epsilon {st['epsilon']:g} at delta = 1/users. "
        "*C over the run*: the clip norm's range over the rounds (mean over seeds). DP "
        f"popularity: at most {st['dp_max_items']} items a user, the same epsilon.",
        "",
        "| data set | run | HR@10 | C over the run | DP popularity | popularity |",
        "|---|---|---|---|---|---|",
    ]
    by = runs_by(d["runs"], "dataset", "arm")
    for (name, arm), runs in by.items():
        ref = d["references"][name]
        lo = statistics.fmean(r["clip_min"] for r in runs)
        hi = statistics.fmean(r["clip_max"] for r in runs)
        clip = f"{lo:.3g}" if abs(hi - lo) < 1e-12 else f"{lo:.3g} to {hi:.3g}"
        lines.append(
            f"| {name} | {arm} | {mean_std([r['test_hr@10'] for r in runs])} | {clip} | "
            f"{mean_std(ref['dp_popularity'])} | {100 * ref['popularity']:.2f} |"
        )
    return lines


def prior_share() -> list[str]:
    """The popularity prior in a DP run, by the share of epsilon its counts take."""
    d: dict[str, Any] | None = load_result("dp_prior.json")
    if d is None:
        return []
    st = d["settings"]
    eps, tuning = st["epsilon"], st["tuning_seed"]
    lines = [
        "",
        "### The popularity prior under DP: a share of the budget (`bench/dp_prior.py`)",
        "",
        f"The `private` preset at epsilon {eps:g} (delta = 1/users) with `--dp-prior-share s`: "
        "the prior's item counts (each user at most k of its items) released once with "
        "Gaussian noise spending s*epsilon alone, the rounds' noise calibrated so that both "
        "together spend epsilon (RDP composition); s = 0 is the preset without the prior. "
        f"*Validation*: HR@10 of the tuning seed {tuning} at its validation-selected round (what "
        f"chooses s); *test*: HR@10 (%) mean ± std over seeds {st['seeds']}; *model*: the model's "
        "own test figure at that round; *z*: the rounds' noise multiplier. DP popularity with "
        f"the same k: at the whole epsilon {eps:g} and at s*epsilon.{prior_choice_note(d)}",
        "",
        "| data set | s | validation (tuning seed) | test HR@10 | model alone | z | DP popularity "
        "at s*epsilon | DP popularity | popularity |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by = runs_by(d["runs"], "dataset", "share")
    for (name, share), runs in by.items():
        ref = d["references"][name]
        tune = [r for r in runs if r["seed"] == tuning]
        rep = [r for r in runs if r["seed"] != tuning]
        part = ref["dp_popularity_at_share"].get(str(share))
        lines.append(
            f"| {name} | {share:g} | {mean_std([r['val_hr@10'] for r in tune])} | "
            f"{mean_std([r['test_hr@10'] for r in rep])} | "
            f"{mean_std([r['model_test_hr@10'] for r in rep])} | {rep[0]['noise']:.3f} | "
            f"{'-' if part is None else mean_std(part)} | {mean_std(ref['dp_popularity'])} | "
            f"{100 * ref['popularity']:.2f} |"
        )
    return lines


def item_tables() -> list[str]:
    """DP at 100,000 users with spectral item tables (``bench/dp_item_tables.py``)."""
    d: dict[str, Any] | None = load_result("dp_item_tables.json")
    if d is None:
        return []
    st = d["settings"]
    lines = [
        "",
        "### Spectral item tables under DP: 100,000 users (`bench/dp_item_tables.py`)",
        "",
        f"`bench.dp_scale`'s split ({st['users']:,} users with taste groups, 1,000 items), the "
        f"default preset with Poisson cohorts of 1%, clip norm C = {DP_CLIP:g} and target epsilon "
        f"{st['epsilon']:g} at delta = 1/users, {st['rounds']} rounds, `--dp-item-share s`: the "
        "item tables start from one release of the item co-occurrence spending s*epsilon alone "
        "(its eigenvectors above the noise's spectral edge) and stay fixed; the rounds train and "
        "release the score network only, their noise calibrated to what is left; each user "
        "fits its own embeddings to the model before ranking (the preset's rank fit). Test "
        "HR@10 (%) at the validation-selected round, seeds "
        f"{st['seeds']}. The DP run with trained item tables is `bench/dp_scale.py`'s (above).",
        "",
        "| run | epsilon spent | noise z (rounds) | noise z (co-occurrence) | HR@10 | NDCG@10 | "
        "rounds selected |",
        "|---|---|---|---|---|---|---|",
    ]
    by = runs_by(d["runs"], "share")
    for share, runs in by.items():
        lines.append(
            f"| spectral item tables, s = {share:g} | "
            f"{max(r['epsilon_spent'] for r in runs):.2f} | {runs[0]['noise']:.3f} | "
            f"{runs[0]['item_noise']:.3f} | {mean_std([r['test_hr@10'] for r in runs])} | "
            f"{mean_std([r['test_ndcg@10'] for r in runs])} | "
            f"{', '.join(str(r['round']) for r in runs)} |"
        )
    lines += [
        "",
        f"On the same split: popularity {100 * d['popularity']:.2f}; DP popularity at epsilon "
        f"{st['epsilon']:g} {mean_std(d['dp_popularity'])}; the private co-occurrence ranking "
        f"at epsilon {st['epsilon']:g} (one release, all of the budget) "
        f"{mean_std(d['dp_cooccurrence'])}.",
    ]
    return lines


def spectrum() -> list[str]:
    """The item co-occurrence's spectrum against one private release's noise."""
    d: dict[str, Any] | None = load_result("dp_spectrum.json")
    if d is None:
        return []
    st = d["settings"]
    lines = [
        "",
        "### What survives one private release of the item co-occurrence (`bench/dp_spectrum.py`)",
        "",
        "A measurement of the data, not of the model. Each user's distinct training items as a "
        "unit-norm row; G, the sum of their outer products, moves by at most 1 (Frobenius) "
        "when one user is added or removed. One Gaussian release of G spending all of epsilon "
        "(delta = 1/users) carries noise z on every entry, and a direction "
        "of G with eigenvalue lambda stands out of that noise only above z*sqrt(items) (the "
        "BBP transition), with squared overlap 1 - (z*sqrt(items)/lambda)^2 with the true "
        "one. lambda 1 is the popularity direction; the ones after it are what "
        "personalised ranking is made of. *Users needed*: at the same kind of users, how "
        "many would bring the 2nd (5th) direction to a squared overlap of 1/2 (lambda grows "
        "with the users, the threshold does not). *Ranking*: each user's candidates scored by "
        "its own history times the rank-k part of G (k on validation): `fedrec train --method "
        "cooccurrence`, from the exact G and, with `--target-epsilon`, from the release "
        f"(seeds {st['seeds']}); test HR@10 (%), DP popularity at the same epsilon.",
        "",
        "| data set | users | items | epsilon | z | threshold | lambda 1, 2, 3, 5 | directions "
        "above | users needed, 2nd (5th) | ranking, exact G | ranking, release | DP popularity "
        "| popularity |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["runs"]:
        lam = r["eigenvalues"]
        lines.append(
            f"| {r['dataset']} | {r['users']:,} | {r['items']:,} | {r['epsilon']:g} | "
            f"{r['noise_multiplier']:.2f} | "
            f"{r['threshold']:.1f} | {lam[0]:.1f}, {lam[1]:.1f}, {lam[2]:.1f}, {lam[4]:.1f} | "
            f"{r['directions_visible']} | {r['users_needed_second']:,.0f} "
            f"({r['users_needed_fifth']:,.0f}) | {100 * r['exact']['test_hr@10']:.2f} | "
            f"{mean_std([p['test_hr@10'] for p in r['private']])} | "
            f"{mean_std(r['dp_popularity_test_hr@10'])} | "
            f"{100 * r['popularity_test_hr@10']:.2f} |"
        )
    first = min(r["epsilon"] for r in d["runs"])
    real = [
        r for r in d["runs"] if not r["dataset"].startswith("synthetic") and r["epsilon"] == first
    ]
    if real:
        most = max(r["directions_visible"] for r in real)
        lines += [
            "",
            f"Reading: at epsilon {first:g}, on the three real data sets at most {most} "
            "direction(s), popularity's included, rise above the noise"
            + (
                f" (on {', '.join(r['dataset'] for r in real if r['directions_visible'] == most)})"
                if most
                else ""
            )
            + "; they would need "
            f"{min(r['users_needed_second'] for r in real):,.0f} to "
            f"{max(r['users_needed_second'] for r in real):,.0f} users of the same kind for "
            "the first direction beyond popularity to be read at half its strength. "
            "This bounds mechanisms that read the second moment once, not every mechanism; "
            "with `bench.dp_signal` (the federated model's own signal against its noise) it is "
            "why no DP run here beats DP popularity on these data sets: at this budget and "
            "population there is hardly any personal signal left to learn from.",
        ]
    worse = [
        r
        for r in d["runs"]
        if not r["dataset"].startswith("synthetic")
        and r["directions_visible"] > 1
        and statistics.fmean(p["test_hr@10"] for p in r["private"])
        < statistics.fmean(r["dp_popularity_test_hr@10"])
    ]
    if worse:
        w = max(  # the widest gap
            worse,
            key=lambda r: (
                statistics.fmean(r["dp_popularity_test_hr@10"])
                - statistics.fmean(p["test_hr@10"] for p in r["private"])
            ),
        )
        lines[-1] += (
            " A direction above the noise is needed, not enough: a ranking reads each item's "
            "entry, and over thousands of items the noise left in a released direction still "
            f"outweighs the long tail's entries ({w['dataset']} at epsilon {w['epsilon']:g}: "
            f"{w['directions_visible']} directions above the noise, the private ranking at "
            f"{100 * statistics.fmean(p['test_hr@10'] for p in w['private']):.2f} against DP "
            f"popularity's {100 * statistics.fmean(w['dp_popularity_test_hr@10']):.2f})."
        )
    big = [r for r in d["runs"] if r["dataset"].startswith("synthetic")]
    if big:
        lines += [
            "",
            f"Where the data allow it, one private release recommends well: at "
            f"{big[0]['users']:,} users ({big[0]['dataset']}) "
            + "; ".join(
                f"at epsilon {r['epsilon']:g}, {r['directions_visible']} of the first "
                f"{len(r['eigenvalues'])} directions are above the noise and the private "
                "co-occurrence ranking reaches "
                f"{100 * statistics.fmean(p['test_hr@10'] for p in r['private']):.2f}"
                for r in big
            )
            + f", against {100 * big[0]['exact']['test_hr@10']:.2f} from the exact G and "
            f"{100 * statistics.fmean(big[0]['dp_popularity_test_hr@10']):.2f} for DP "
            "popularity (the federated model on the same split: `bench/dp_scale.py` above).",
        ]
    return lines
