"""What a finished set of runs shows: the HR/NDCG curves as a PNG and the mean +- std over
seeds of the best-test and validation-selected figures."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

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


def seed_line(res: RunResult) -> str:
    """One seed's time, best test round and validation-selected round."""
    best, sel = res.best_test(), res.selected()
    line = f"seed {res.config.get('seed', '-')}: {res.wall_seconds:.1f}s"
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
    return line


def final_line(summary: dict[str, Any], n_seeds: int) -> str:
    """The mean over the seeds of the best test round (and of the validation-selected one)."""
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
