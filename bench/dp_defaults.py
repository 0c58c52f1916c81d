"""What `fedrec train --target-epsilon E` gives with no preset named: before (the default
preset, server Adam) and now (the private preset: server SGD with momentum, adaptive clipping),
beside the same private settings with a clip norm fixed by hand, and DP popularity.

    nice -n 5 .venv/bin/python -m bench.dp_defaults [--epsilon 3] [--seeds 1,2,3]
        [--datasets filmtrust/paper,...] [--out bench/results/dp_defaults.json]

Arms, each a simulated run built from a preset's settings as ``fedrec train`` builds it, with
``--target-epsilon`` (delta = 1/users), test HR@10 at the validation-selected evaluated round:

* ``before``: the default preset (what a DP run without a preset took before the private
  preset; server Adam, 300 rounds, clip norm 1, fixed-size cohorts), the first seed only (its
  300 rounds of clipped uploads take about ten minutes a seed here);
* ``private, C = c``: the private preset with the clip norm fixed at c (1, the run configs'
  default; 0.25, the norm picked by hand for the DP rows of docs/RESULTS.md);
* ``private``: the private preset as shipped (adaptive clipping towards the median norm).

``--full-datasets`` run every arm; the others only ``private``. Every data set also gets DP
popularity at the same epsilon (``--dp-max-items`` items a user) and plain popularity.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.bench_cli import (
    IntList,
    Ints,
    OutFile,
    default_data_dir,
    fail,
    in_fresh_processes,
    validation_split,
    write_result,
)

if TYPE_CHECKING:
    from fedrecgel.simulate import RunResult, Simulator

OUT = Path(__file__).resolve().parent / "results" / "dp_defaults.json"
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "before": ("default", {}),
    "private, C = 1": ("private", {"dp_clip": 1.0, "dp_clip_quantile": None}),
    "private, C = 0.25": ("private", {"dp_clip": 0.25, "dp_clip_quantile": None}),
    "private": ("private", {}),
}


def private_run(
    job: dict[str, Any], preset: str, changes: dict[str, Any]
) -> tuple[Simulator, RunResult, float]:
    """Train ``preset`` with ``changes`` on the job's ``dataset`` (from ``data_dir``) at its
    ``epsilon``, ``seed`` and ``eval_every``, in a worker process: the ``Simulator``, its
    ``RunResult`` and the ``time.perf_counter()`` at the start of the run."""
    import torch

    from fedrecgel.presets import run_settings
    from fedrecgel.simulate import Simulator, TrainConfig

    torch.set_num_threads(1)
    split = validation_split(job["dataset"], job["data_dir"])
    settings = {**run_settings(preset, job["dataset"].split("/")[0]), **changes}
    cfg = TrainConfig(
        **settings,
        target_epsilon=job["epsilon"],
        seed=job["seed"],
        eval_every=job["eval_every"],
        grouped_uploads=True,  # clipped uploads built in groups: the same up to rounding
    )
    t0 = time.perf_counter()
    sim = Simulator(split, cfg)
    return sim, sim.run(), t0


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One run, in a worker process: the validation-selected test figures and the clip norms."""
    _, res, t0 = private_run(job, *ARMS[job["arm"]])
    sel = res.selected()
    assert sel is not None  # the split has validation items
    clips = [r.dp_clip for r in res.rounds if r.dp_clip is not None]
    return {
        **{k: v for k, v in job.items() if k != "data_dir"},
        "test_hr@10": sel["hr@10"],
        "test_ndcg@10": sel["ndcg@10"],
        "round": sel["round"],
        "rounds": len(res.rounds),
        "epsilon_spent": res.epsilon_spent(),
        "clip_first": clips[0] if clips else None,
        "clip_last": clips[-1] if clips else None,
        "clip_min": min(clips) if clips else None,
        "clip_max": max(clips) if clips else None,
        "seconds": time.perf_counter() - t0,
    }


def _references(
    name: str, data_dir: Path | None, epsilon: float, seeds: list[int], k: int
) -> dict[str, Any]:
    from fedrecgel.baselines import popularity
    from fedrecgel.dp_popularity import dp_popularity, plan_release

    split = validation_split(name, data_dir)
    release = plan_release(split.n_users, max_items=k, target_epsilon=epsilon)
    return {
        "popularity": popularity(split).rounds[0].test["hr@10"],
        "dp_popularity": [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in seeds],
        "users": split.n_users,
    }


def main(
    epsilon: float = 3.0,
    seeds: IntList = Ints([1, 2, 3]),
    full_datasets: str = "filmtrust/paper",
    datasets: str = "lastfm-2k/clean,amazon-video/paper",
    data_dir: Path | None = default_data_dir(),
    eval_every: int = 10,
    dp_max_items: int = 10,
    out: OutFile = OUT,
) -> None:
    if not 0 < epsilon < math.inf:
        raise fail(f"--epsilon must be a number > 0, got {epsilon}")
    full = [d.strip() for d in full_datasets.split(",") if d.strip()]
    rest = [d.strip() for d in datasets.split(",") if d.strip()]
    if not (full or rest):
        raise fail("--full-datasets and --datasets name no data set")
    common = {"epsilon": epsilon, "eval_every": eval_every, "data_dir": data_dir}
    jobs = [
        {**common, "dataset": d, "arm": arm, "seed": s}
        for d in full + rest
        for arm in (ARMS if d in full else ("private",))
        for s in (seeds[:1] if arm == "before" else seeds)
    ]
    t0 = time.perf_counter()
    runs = in_fresh_processes(_one, jobs)
    for r in runs:
        print(f"{r['dataset']} {r['arm']} seed {r['seed']}: {100 * r['test_hr@10']:.2f}")
    refs = {d: _references(d, data_dir, epsilon, seeds, dp_max_items) for d in full + rest}
    settings = {
        "epsilon": epsilon,
        "seeds": seeds,
        "eval_every": eval_every,
        "dp_max_items": dp_max_items,
        "arms": {k: {"preset": p, "changes": c} for k, (p, c) in ARMS.items()},
    }
    write_result(out, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
