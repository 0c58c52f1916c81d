"""What sparse secure aggregation's per-round item counts reveal over a run, and what cohorts
of whole groups (``cohort_groups``) leave of it.

    nice -n 5 .venv/bin/python -m bench.secagg_union [--marks 10,30,100,300]
        [--accuracy-seeds 0,1,2 | --no-accuracy] [--group-size 10]

*Attack* (:mod:`harness.union_attack`): a run's cohorts as the simulator and the aggregator
draw them (the default fraction 0.1, fixed-size, seed 0) and each round's public negative pool
of 128 items; each round, instance A's unmasked counts (the protocol itself for the first
``--protocol-rounds`` rounds, checked equal to the plain count, then the plain count). The
server marks every (user, item) that was in no round whose union lacked the item; figures at
each round of ``--marks``. Two arms: clients drawn one by one (the default), and cohorts of
whole groups, ``cohort_groups`` = users / ``--group-size``; and, for comparison, dense secure
aggregation without a pool (negatives uniform over the catalogue), whose sum shows the rows
some cohort member's samples touched.

*Accuracy*: ``fedrec train`` on FilmTrust at the defaults with ``--negative-pool 128`` (what a
sparse secure run needs), with and without ``--cohort-groups``, plain uploads (a secure round's
mean equals the plain one to within its fixed-point step, tests/core/test_secagg_sparse.py),
seeds ``--accuracy-seeds``: test HR@10 at the round chosen on validation.

Writes bench/results/secagg_union.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy_diagnosis import load
from bench.bench_cli import ROOT, IntList, Ints, Positive, default_data_dir, run
from fedrecgel.config import RunParams
from fedrecgel.presets import run_settings
from harness.union_attack import Attribution, holdings, observe, observe_dense, scores

OUT = ROOT / "bench" / "results" / "secagg_union.json"
DATASETS = ("filmtrust/paper", "lastfm-2k/clean", "amazon-video/paper")
#: the rounds of a run at the default preset (the last mark)
PRESET_ROUNDS = int(run_settings("default", "filmtrust")["rounds"])
#: the public pool of negatives a sparse secure run draws from (bench/secagg_cost's middle one)
POOL = 128
#: users per group in the grouped arm: ``cohort_groups`` = users / this
GROUP_SIZE = 10


def run_params(groups: int | None) -> RunParams:
    """A sparse secure run at the defaults (seed 0), its cohorts of ``groups`` groups or not."""
    return RunParams(secure_aggregation="sparse", negative_pool=POOL, seed=0, cohort_groups=groups)


def attack(
    key: str, data_dir: Path | None, marks: list[int], protocol_rounds: int, size: int
) -> dict[str, Any]:
    """Both arms' figures on data set ``key`` at each round of ``marks``."""
    split = load(key, data_dir)
    held = [split.user_train(u) for u in range(split.n_users)]
    truth = holdings(held, split.n_items)
    groups = max(2, round(split.n_users / size))
    out: dict[str, Any] = {"dataset": key, "users": split.n_users, "items": split.n_items}
    for arm, g in (("clients", None), ("groups", groups), ("dense", None)):
        params = run_params(g)
        att = Attribution(split.n_users, split.n_items)
        rows, cohorts, t0 = [], [], time.perf_counter()
        if arm == "dense":
            seen = observe_dense(held, split.n_items, params, max(marks))
        else:
            seen = observe(held, split.n_items, params, max(marks), protocol_rounds)
        for obs in seen:
            att.add(obs)
            cohorts.append(len(obs.cohort))
            if obs.round_id in marks:
                rows.append({"round": obs.round_id, **scores(att.suspects(), truth)})
                print(key, arm, rows[-1], flush=True)
        out[arm] = {
            "cohort_groups": g,
            "mean_cohort": float(np.mean(cohorts)),
            "protocol_rounds": protocol_rounds,
            "seconds": time.perf_counter() - t0,
            "marks": rows,
        }
    return out


def train(groups: int | None, seeds: list[int], folder: Path) -> dict[str, Any]:
    """``fedrec train`` on FilmTrust at the defaults with the pool: per seed, the test figures
    at the round chosen on validation."""
    cmd = [sys.executable, "-m", "fedrecgel.cli", "train", "--quiet", "--overwrite"]
    cmd += ["--seeds", ",".join(map(str, seeds)), "--negative-pool", str(POOL)]
    if groups is not None:
        cmd += ["--cohort-groups", str(groups)]
    cmd += ["--out", str(folder)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    doc = json.loads((folder / "results.json").read_text())
    runs = [
        {"seed": r["config"]["seed"], **{k: r["selected_on_validation"][k] for k in SEL}}
        for r in doc["runs"]
    ]
    return {"cohort_groups": groups, "command": " ".join(["fedrec", *cmd[3:-2]]), "runs": runs}


#: the figures kept of a run's validation-selected round
SEL = ("round", "hr@10", "ndcg@10")


def main(
    marks: IntList = Ints([10, 30, 100, PRESET_ROUNDS]),
    protocol_rounds: Positive = 3,
    group_size: Positive = GROUP_SIZE,
    accuracy_seeds: IntList = Ints([0, 1, 2]),
    accuracy: bool = True,
    data_dir: Path | None = default_data_dir(),
) -> None:
    started = time.time()
    result: dict[str, Any] = {
        "command": "python -m bench.secagg_union "
        f"--marks {','.join(map(str, marks))} --group-size {group_size} "
        f"--accuracy-seeds {','.join(map(str, accuracy_seeds))}",
        "pool": POOL,
        "group_size": group_size,
        "attack": [attack(k, data_dir, marks, protocol_rounds, group_size) for k in DATASETS],
        "accuracy": [],
    }

    def write() -> None:
        result["seconds"] = time.time() - started
        OUT.write_text(json.dumps(result, indent=1) + "\n")

    write()
    if accuracy:
        n_users = load("filmtrust/paper", data_dir).n_users
        with tempfile.TemporaryDirectory() as tmp:
            for g in (None, max(2, round(n_users / group_size))):
                got = train(g, accuracy_seeds, Path(tmp) / f"groups-{g}")
                result["accuracy"].append(got)
                print(json.dumps(got), flush=True)
                write()


if __name__ == "__main__":
    run(main)
