"""Why client-level DP does not beat a private popularity count: each data set's signal against
its noise. A measurement, NOT a private run.

    nice -n 5 .venv/bin/python -m bench.dp_signal [--datasets filmtrust/paper,...]
        [--epsilon 3] [--seed 100] [--out bench/results/dp_signal.json]

Each data set runs the DP setting of ``bench.dp_scale`` (the shipped ``default`` preset's client
settings, uploads clipped to C = ``--clip``, server SGD step 1.2 with momentum 0.9, Poisson
cohorts, the accountant's noise multiplier z for ``--epsilon`` at delta = 1/users over the run's
rounds), but the noise is
measured instead of added: :func:`fedrecgel.privacy.noisy_mean` is replaced in the run's worker
process by one that records, each round, the clipped mean of the cohort's uploads (the signal)
against the noise the DP run would put on it (standard deviation z*C over the expected cohort,
on every coordinate), then returns the mean without noise. So the run follows the clipped
trajectory without noise, and its validation curve is the ceiling of that DP setting (beside
the popularity ranking's validation HR@10 on the same split).

Per round, for the two item tables together and for the score network:

* the norm of the signal and of the noise (sigma times the square root of the coordinates);
* the share of the item tables' rows whose signal row is longer than its noise row (sigma times
  the square root of the row's width): rows a round moves more than its noise does;
* the share of rows whose signal is longer than the noise along it (sigma): what a reading of
  the rows in one fixed direction (a popularity direction) would see above the noise.

Over the run, the same for the sum of the rounds' signals against the sum of their noises
(sigma times the square root of the rounds): what a server SGD without momentum integrates.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from bench.bench_cli import (
    OutFile,
    default_data_dir,
    in_fresh_processes,
    subset,
    validation_split,
    write_result,
)
from fedrecgel.config import DEFAULTS

OUT = Path(__file__).resolve().parent / "results" / "dp_signal.json"
SYNTHETIC = "synthetic-tastes-100k"
#: the data sets and the cohort fraction and rounds of their DP rows
SETTINGS: dict[str, tuple[float, int]] = {
    "filmtrust/paper": (0.1, 50),
    "lastfm-2k/clean": (0.1, 50),
    "amazon-video/paper": (0.1, 50),
    SYNTHETIC: (0.01, DEFAULTS.rounds),
}


def _split(name: str, data_dir: Path | None) -> Any:
    if name == SYNTHETIC:
        from bench.dp_scale import _split as tastes

        return tastes(100_000)
    return validation_split(name, data_dir)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def _measure(job: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One data set in a worker process of its own (it replaces ``noisy_mean`` there)."""
    import torch

    import fedrecgel.privacy as privacy
    from fedrecgel.baselines import popularity
    from fedrecgel.model import ITEM_TABLES
    from fedrecgel.presets import run_settings
    from fedrecgel.simulate import Simulator, TrainConfig

    torch.set_num_threads(1)
    name, s = job
    rounds: list[dict[str, float]] = []
    summed: dict[str, torch.Tensor] = {}

    def measured(
        total: dict[str, torch.Tensor], den: float, sigma: float, gen: torch.Generator
    ) -> dict[str, torch.Tensor]:
        noise = sigma / den  # the noise's standard deviation on each coordinate of the mean
        mean = {k: t / den for k, t in total.items()}
        for k, t in mean.items():
            summed[k] = summed[k] + t if k in summed else t.clone()
        rounds.append(_shares(mean, noise, ITEM_TABLES, 1))
        return mean

    privacy.noisy_mean = measured  # type: ignore[assignment]
    fraction, n_rounds = s["fraction"], s["rounds"]
    preset = run_settings("default", "synthetic" if name == SYNTHETIC else name.split("/")[0])
    cfg = TrainConfig(
        **{
            **preset,
            "rounds": n_rounds,
            "fraction": fraction,
            "sampling": "poisson",
            "eval_every": s["eval_every"],
            "seed": s["seed"],
            "optimizer": "sgd",
            "server_lr": 1.2,
            "server_momentum": 0.9,
            "server_weight_decay": 0.0,
            "dp_clip": s["clip"],
            "target_epsilon": s["epsilon"],
            "grouped_uploads": True,
        }
    )
    t0 = time.perf_counter()
    split = _split(name, s["data_dir"])
    sim = Simulator(split, cfg)
    res = sim.run()
    plan = sim.privacy
    assert plan is not None
    noise = plan.noise * s["clip"] / (fraction * split.n_users)
    curve = [{"round": r.round, "val_hr@10": r.val["hr@10"]} for r in res.rounds if r.val]
    return {
        "dataset": name,
        "users": split.n_users,
        "items": split.n_items,
        "fraction": fraction,
        "rounds": n_rounds,
        "noise_multiplier": plan.noise,
        "noise_std_of_the_mean": noise,
        "per_round": rounds,
        "per_round_median": {k: _median([r[k] for r in rounds]) for k in rounds[0]},
        "over_the_run": _shares(summed, noise, ITEM_TABLES, len(rounds)),
        "best_val_hr@10_without_noise": max(c["val_hr@10"] for c in curve),
        "popularity_val_hr@10": popularity(split).rounds[0].val["hr@10"],
        "curve": curve,
        "seconds": time.perf_counter() - t0,
    }


def _shares(
    mean: dict[str, Any], noise: float, tables: tuple[str, ...], k: int
) -> dict[str, float]:
    """Signal against the noise of ``k`` rounds (std ``noise * sqrt(k)`` on each coordinate)."""
    import torch

    sd = noise * math.sqrt(k)
    items = [mean[t] for t in tables]
    net = [t for n, t in mean.items() if n not in tables]
    item_coords = sum(t.numel() for t in items)
    net_coords = sum(t.numel() for t in net)
    rows = torch.cat([t.norm(dim=1) for t in items])
    width = items[0].shape[1]
    return {
        "item_signal": float(math.sqrt(sum(float(t.square().sum()) for t in items))),
        "item_noise": sd * math.sqrt(item_coords),
        "network_signal": float(math.sqrt(sum(float(t.square().sum()) for t in net))),
        "network_noise": sd * math.sqrt(net_coords),
        "rows_above_noise": float((rows > sd * math.sqrt(width)).float().mean()),
        "rows_above_noise_along": float((rows > sd).float().mean()),
        "rows_moved": float((rows > 0).float().mean()),
    }


def main(
    datasets: str = ",".join(SETTINGS),
    data_dir: Path | None = default_data_dir(),
    epsilon: float = 3.0,
    clip: float = 0.25,
    seed: int = 100,
    eval_every: int = 10,
    out: OutFile = OUT,
) -> None:
    chosen = subset(datasets, SETTINGS, "--datasets")
    settings = {"epsilon": epsilon, "clip": clip, "seed": seed, "eval_every": eval_every}
    jobs = [
        (
            n,
            {
                **settings,
                "fraction": SETTINGS[n][0],
                "rounds": SETTINGS[n][1],
                "data_dir": data_dir,
            },
        )
        for n in chosen
    ]
    t0 = time.perf_counter()
    # a process per data set: each replaces fedrecgel.privacy.noisy_mean in its own
    runs = in_fresh_processes(_measure, jobs)
    for r in runs:
        m, o = r["per_round_median"], r["over_the_run"]
        print(
            f"{r['dataset']}: item signal/noise a round {m['item_signal'] / m['item_noise']:.3f}, "
            f"over the run {o['item_signal'] / o['item_noise']:.3f}; rows above noise a round "
            f"{100 * m['rows_above_noise']:.1f}%, over the run {100 * o['rows_above_noise']:.1f}%; "
            f"network {m['network_signal'] / m['network_noise']:.3f} / "
            f"{o['network_signal'] / o['network_noise']:.3f}",
            flush=True,
        )
    write_result(out, {"settings": settings, "runs": runs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
