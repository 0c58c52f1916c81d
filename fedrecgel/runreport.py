"""What a finished set of runs shows: the HR/NDCG curves as a PNG, the mean +- std over seeds
of the best-test and validation-selected figures, and the reference points (popularity, and
under DP popularity at the same budget) they are read against."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fedrecgel.config import ConfigError
from fedrecgel.data import Split
from fedrecgel.simulate import RunResult


def plot_run(results: list[RunResult], path: Path) -> None:
    """HR@10 and NDCG@10 per round (one line per seed) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for res in results:
        rounds = [r.round for r in res.rounds if r.test]
        seed = res.config["seed"]
        for ax, key in zip(axes, ("hr@10", "ndcg@10"), strict=True):
            (line,) = ax.plot(
                rounds, [r.test[key] for r in res.rounds if r.test], label=f"seed {seed} test"
            )
            if any(r.val for r in res.rounds):
                ax.plot(
                    rounds,
                    [r.val[key] for r in res.rounds if r.test],
                    linestyle=":",
                    color=line.get_color(),
                    label=f"seed {seed} validation",
                )
    for ax, key in zip(axes, ("HR@10", "NDCG@10"), strict=True):
        ax.set_xlabel("round")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    cfg = results[0].config
    fig.suptitle(
        f"{results[0].dataset}: {cfg['method']}"
        + (f" (rho_sh={cfg['rho_sh']}, rho_ns={cfg['rho_ns']})" if "rho_sh" in cfg else "")
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """Mean and std over seeds of the best-test and validation-selected figures."""
    out: dict[str, Any] = {}
    for kind, getter in (("best_test", RunResult.best_test), ("selected", RunResult.selected)):
        rows = [getter(r) for r in results]
        if any(row is None for row in rows):
            continue
        for key in ("hr@10", "ndcg@10", "hr@5", "ndcg@5", "hr@20", "ndcg@20"):
            vals = [float(row[key]) for row in rows if row is not None]
            out[f"{kind}.{key}.mean"] = statistics.fmean(vals)
            out[f"{kind}.{key}.std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return out


def single_ranking(res: RunResult) -> bool:
    """Whether ``res`` is one ranking (a reference point's: popularity, random, co-occurrence,
    recorded as round 0), not a model trained over rounds: it has no round to choose."""
    return bool(res.rounds) and all(r.round == 0 for r in res.rounds)


def seed_line(res: RunResult) -> str:
    """One seed's time, best test round and validation-selected round; for a single ranking
    its test figures (and, for a reference point that draws nothing, that it has no seed)."""
    best, sel = res.best_test(), res.selected()
    seed = res.config.get("seed")
    who = f"seed {seed}" if seed is not None else f"{res.config.get('method', 'run')} (no seed)"
    line = f"{who}: {res.wall_seconds:.1f}s"
    if single_ranking(res):
        test, rank = res.rounds[0].test, res.config.get("rank")
        line += f"; test HR@10 {test['hr@10']:.4f} NDCG@10 {test['ndcg@10']:.4f} (one ranking"
        if rank is not None:  # co-occurrence: the rank is what validation chose, if anything
            tried = len(res.config.get("ranks_tried", ()))
            line += f" at rank {rank}" + " chosen on validation" * (tried > 1)
        return line + ", no rounds" + "; the same whatever --seeds" * (seed is None) + ")"
    if best:
        line += (
            f"; best test round {best['round']}: HR@10 {best['hr@10']:.4f} "
            f"NDCG@10 {best['ndcg@10']:.4f}"
        )
    if sel:
        line += (
            f"; validation-selected round {sel['round']}: HR@10 {sel['hr@10']:.4f} "
            f"NDCG@10 {sel['ndcg@10']:.4f}"
        )
        if sel.get("prior_weight"):  # the popularity prior changed the ranking served
            line += (
                f" (popularity prior weight {sel['prior_weight']:g}; the model alone "
                f"{sel['model.hr@10']:.4f})"
            )
    return line


def final_line(summary: dict[str, Any], results: list[RunResult]) -> str:
    """The mean over the seeds of the best test round (and of the validation-selected one);
    for single rankings, the mean of their test figures (they have no rounds)."""
    n_seeds = len(results)
    if all(single_ranking(r) for r in results):
        return (
            f"final: HR@10 {summary['best_test.hr@10.mean']:.4f} "
            f"NDCG@10 {summary['best_test.ndcg@10.mean']:.4f} (test"
            + (f", mean of {n_seeds} rankings" if n_seeds > 1 else "; one ranking")
            + ", no rounds)"
        )
    return (
        f"final: HR@10 {summary['best_test.hr@10.mean']:.4f} "
        f"NDCG@10 {summary['best_test.ndcg@10.mean']:.4f} (best test round, mean of "
        f"{n_seeds} seed(s))"
        + (
            f"; validation-selected HR@10 {summary['selected.hr@10.mean']:.4f} "
            f"NDCG@10 {summary['selected.ndcg@10.mean']:.4f}"
            if "selected.hr@10.mean" in summary
            else ""
        )
    )


def references(split: Split, results: list[RunResult]) -> dict[str, Any]:
    """The reference points a federated run's figures are read against, on its split (test
    metrics): ``popularity``; for a DP run also ``dp_popularity``, popularity under the budget
    the run spent (the most any seed spent, at the run's delta; each user counting at most the
    shipped number of items; one noise draw per seed of the run)."""
    from fedrecgel.baselines import popularity
    from fedrecgel.dp_popularity import DEFAULT_MAX_ITEMS, dp_popularity, plan_release

    pop = popularity(split).rounds[0].test
    out: dict[str, Any] = {"popularity": {k: pop[k] for k in ("hr@10", "ndcg@10")}}
    spent = [e for r in results if (e := r.epsilon_spent()) is not None]
    if not spent or results[0].privacy is None:
        return out
    epsilon, delta = max(spent), float(results[0].privacy["delta"])
    try:
        release = plan_release(split.n_users, DEFAULT_MAX_ITEMS, epsilon, delta=delta)
    except ConfigError as err:  # a budget too small or too large for the accountant
        out["dp_popularity"] = {"epsilon": epsilon, "not_computed": err.reason}
        return out
    seeds = [int(r.config.get("seed", 0)) for r in results]
    tests = [dp_popularity(split, release, s).rounds[0].test for s in seeds]
    out["dp_popularity"] = {
        "epsilon": release.epsilon,
        "delta": release.delta,
        "max_items": release.max_items,
        "seeds": seeds,
        **{f"{k}.mean": statistics.fmean(t[k] for t in tests) for k in ("hr@10", "ndcg@10")},
    }
    return out


def references_line(refs: dict[str, Any]) -> str:
    """The reference points of :func:`references` in one line."""
    pop = refs["popularity"]
    line = f"on this split, popularity: HR@10 {pop['hr@10']:.4f} NDCG@10 {pop['ndcg@10']:.4f}"
    dp = refs.get("dp_popularity")
    if dp is None:
        return line
    if "hr@10.mean" not in dp:
        return line + f"; popularity under epsilon {dp['epsilon']:.3g}: {dp['not_computed']}"
    return line + (
        f"; popularity under the same budget (epsilon {dp['epsilon']:.3f}, at most "
        f"{dp['max_items']} items a user): HR@10 {dp['hr@10.mean']:.4f} "
        f"NDCG@10 {dp['ndcg@10.mean']:.4f}"
    )
