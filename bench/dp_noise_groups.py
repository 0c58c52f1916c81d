"""Where DP noise costs accuracy at 100,000 users: a diagnosis, NOT a private run.

    nice -n 5 .venv/bin/python -m bench.dp_noise_groups [--epsilon 8] [--seed 100]
        [--arms clipped,items,network] [--out bench/results/dp_noise_groups.json]

The DP runs of ``bench.dp_scale`` all stop at the popularity plateau (validation HR@10 about
32.3 on the tuning seed) whatever their server optimizer, while the no-DP preset climbs to 34.1
after round 70. Each arm here is the preset (server Adam, the score network's weight decay) on
``bench.dp_scale``'s split and seed, uploads clipped to C = ``--clip``, Poisson cohorts of
``--fraction``, over the same rounds, with the noise of the calibrated epsilon-DP run:

* ``clipped``: no noise at all (clipping alone);
* ``items``: the noise only on the two item tables;
* ``network``: the noise only on the score network.

The noise is put where an arm says by replacing :func:`fedrecgel.privacy.noisy_mean` inside the
arm's worker process; the arms other than ``clipped`` do not satisfy DP (the accountant's
epsilon assumes noise on every coordinate). Reports the validation HR@10 every
``--eval-every`` rounds, and the best.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.bench_cli import OutFile, Positive, in_fresh_processes, subset, write_result
from bench.dp_scale import _split
from fedrecgel.config import DEFAULTS
from fedrecgel.presets import run_settings
from fedrecgel.simulate import Simulator, TrainConfig

OUT = Path(__file__).resolve().parent / "results" / "dp_noise_groups.json"
ARMS = ("clipped", "items", "network")


def _arm(job: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One arm in a worker process: its validation curve."""
    import torch

    import fedrecgel.privacy as privacy
    from fedrecgel.model import ITEM_TABLES

    torch.set_num_threads(1)
    arm, s = job
    noisy_mean = privacy.noisy_mean

    def grouped(
        total: dict[str, torch.Tensor], den: float, sigma: float, gen: torch.Generator
    ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, t in total.items():
            on = (name in ITEM_TABLES) == (arm == "items")
            out.update(noisy_mean({name: t}, den, sigma if on else 0.0, gen))
        return out

    privacy.noisy_mean = grouped  # type: ignore[assignment]
    preset = run_settings("default", "synthetic")
    preset.pop("rounds", None)
    dp: dict[str, Any] = {"dp_noise": 0.0} if arm == "clipped" else {"target_epsilon": s["epsilon"]}
    cfg = TrainConfig(
        **{
            **preset,
            "rounds": s["rounds"],
            "fraction": s["fraction"],
            "sampling": "poisson",
            "eval_every": s["eval_every"],
            "seed": s["seed"],
            "dp_clip": s["clip"],
            "grouped_uploads": True,
            **dp,
        }
    )
    t0 = time.perf_counter()
    res = Simulator(_split(s["users"]), cfg).run()
    curve = [{"round": r.round, "val_hr@10": r.val["hr@10"]} for r in res.rounds if r.val]
    return {
        "arm": arm,
        "epsilon_of_the_noise": res.epsilon_spent() if arm != "clipped" else None,
        "best_val_hr@10": max(c["val_hr@10"] for c in curve),
        "curve": curve,
        "seconds": time.perf_counter() - t0,
    }


def main(
    users: Positive = 100_000,
    rounds: Positive = DEFAULTS.rounds,
    fraction: float = 0.01,
    eval_every: Positive = 10,
    epsilon: float = 8.0,
    clip: float = 0.25,
    seed: int = 100,
    arms: str = ",".join(ARMS),
    out: OutFile = OUT,
) -> None:
    chosen = subset(arms, ARMS, "--arms")
    settings = {
        "users": users,
        "rounds": rounds,
        "fraction": fraction,
        "eval_every": eval_every,
        "epsilon": epsilon,
        "clip": clip,
        "seed": seed,
    }
    t0 = time.perf_counter()
    # a fresh process per arm: each arm replaces fedrecgel.privacy.noisy_mean in its own
    runs = in_fresh_processes(_arm, [(a, settings) for a in chosen])
    for r in runs:
        print(f"{r['arm']}: best validation HR@10 {100 * r['best_val_hr@10']:.2f}", flush=True)
    write_result(out, {"settings": settings, "runs": runs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
