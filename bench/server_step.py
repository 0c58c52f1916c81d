"""The server step at large catalogues: dense against lazy server Adam (``server_update``).

    .venv/bin/python -m bench.server_step speed [--items 100000,1000000] [--rounds 4]
    .venv/bin/python -m bench.server_step accuracy [--seeds 0,1,2] [--datasets filmtrust/paper]

``speed``: in one process and interleaved round by round, three simulators over the same
synthetic split (10,000 users, mean 14 interactions, 1,000 clients a round, the scaling sweep's
catalogue point, ``bench/scaling.py``): ``dense`` (the default), ``lazy`` (the rows are the
items of the round's samples) and ``lazy-scan`` (lazy, the rows found by scanning the
aggregated gradient for nonzero rows, as the aggregator does). Seconds of the server step
(the strategy's ``apply``) and of the whole round, median over the rounds after the first
(whose clients join), and the rows a round touched.

``accuracy``: ``fedrec train`` at the default preset with ``--server-update dense`` and
``lazy``, per seed, and ``--method popularity``; the validation-selected test HR@10.

Writes its part into bench/results/server_step.json (the other part is kept).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NewType

from bench.bench_cli import Ints, OutFile, Positive, cli_type, one_of, opt

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "server_step.json"
MODES = ("dense", "lazy", "lazy-scan")
USERS, MEAN, CLIENTS = 10_000, 14.0, 1_000


def speed_point(items: int, rounds: int) -> dict[str, Any]:
    """One catalogue size: the three simulators, ``rounds`` rounds each, interleaved."""
    import numpy as np
    import torch

    from fedrecgel.cohort import select_cohort
    from fedrecgel.simulate import Simulator, TrainConfig
    from fedrecgel.synthetic import synthetic_split

    torch.set_grad_enabled(False)
    split = synthetic_split(USERS, items, interactions_per_user=MEAN, seed=0)
    base = TrainConfig(fraction=CLIENTS / USERS, eval_every=0, rounds=rounds)
    sims = {
        "dense": Simulator(split, base),
        "lazy": Simulator(split, base.replace(server_update="lazy")),
        "lazy-scan": Simulator(split, base.replace(server_update="lazy")),
    }
    spent = dict.fromkeys(MODES, 0.0)

    def timed(mode: str, apply: Any, scan: bool) -> Any:
        def run(params: Any, grads: Any, rows: Any = None) -> None:
            t = time.perf_counter()
            apply(params, grads, None if scan else rows)
            spent[mode] += time.perf_counter() - t

        return run

    for mode, sim in sims.items():
        sim.strategy.apply = timed(mode, sim.strategy.apply, mode == "lazy-scan")  # type: ignore[method-assign]
    per: dict[str, dict[str, list[float]]] = {m: {"round": [], "server": []} for m in MODES}
    touched = []
    for r in range(1, rounds + 1):
        cohort = select_cohort(sims["dense"].users, base.fraction, base.seed, r)
        samples = sims["dense"].samples_for(cohort, r)
        touched.append(len(np.unique(np.concatenate([s[0].ravel() for s in samples]))))
        order = MODES if r % 2 else MODES[::-1]
        for mode in order:
            sim = sims[mode]
            sim.store.get(cohort)  # the clients' private state exists before the timed round
            spent[mode] = 0.0
            t0 = time.perf_counter()
            sim.step()
            per[mode]["round"].append(time.perf_counter() - t0)
            per[mode]["server"].append(spent[mode])
    same_lazy = all(
        torch.equal(v, sims["lazy-scan"].shared[k]) for k, v in sims["lazy"].shared.items()
    )
    out: dict[str, Any] = {
        "items": items,
        "users": USERS,
        "clients": len(cohort),
        "rounds": rounds,
        "touched_rows_per_round": touched,
        "lazy_equals_lazy_scan": same_lazy,
        "load_average": os.getloadavg()[0],
    }
    for mode in MODES:
        later = slice(1, None) if rounds > 1 else slice(None)
        out[mode] = {
            "round_s": float(np.median(per[mode]["round"][later])),
            "server_step_s": float(np.median(per[mode]["server"][later])),
            "rounds_s": per[mode]["round"],
            "server_steps_s": per[mode]["server"],
        }
    return out


def accuracy_run(dataset: str, protocol: str, seed: int, extra: list[str]) -> dict[str, Any]:
    """One ``fedrec train`` call; its validation-selected test figures."""
    fedrec = Path(sys.executable).with_name("fedrec")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(fedrec),
            "train",
            "--dataset",
            dataset,
            "--protocol",
            protocol,
            "--seeds",
            str(seed),
            "--out",
            tmp,
            "--quiet",
            *extra,
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        res = json.loads((Path(tmp) / "results.json").read_text())
    (run,) = res["runs"]
    sel = run.get("selected_on_validation") or {}
    return {
        "seed": seed,
        "selected_hr@10": sel.get("hr@10"),
        "selected_ndcg@10": sel.get("ndcg@10"),
        "selected_round": sel.get("round"),
        "seconds": time.perf_counter() - t0,
    }


def accuracy(datasets: list[str], seeds: list[int], eval_every: int, out: Path) -> None:
    """Dense and lazy at the default preset, and popularity, per dataset and seed."""
    for name in datasets:
        dataset, protocol = name.split("/")
        for seed in seeds:
            for key, extra in (
                ("popularity", ["--method", "popularity"]),
                ("dense", ["--server-update", "dense", "--eval-every", str(eval_every)]),
                ("lazy", ["--server-update", "lazy", "--eval-every", str(eval_every)]),
            ):
                data = _load(out)
                done = data.setdefault("accuracy", {}).setdefault(name, {}).setdefault(key, [])
                if any(r["seed"] == seed for r in done):
                    continue
                done.append(accuracy_run(dataset, protocol, seed, extra))
                data["accuracy_eval_every"] = eval_every
                _save(out, data)
                print(name, key, done[-1], flush=True)


def _load(out: Path) -> dict[str, Any]:
    return json.loads(out.read_text()) if out.exists() else {}


def _save(out: Path, data: dict[str, Any]) -> None:
    out.write_text(json.dumps(data, indent=1) + "\n")


Names = NewType("Names", list[str])


def _ints(least: int) -> Callable[[str], Ints]:
    """A parser of comma-separated integers, each at least ``least``."""

    def parse(text: str) -> Ints:
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < least:
            raise ValueError(f"integers >= {least}, comma-separated, not {text!r}")
        return Ints(values)

    return cli_type(parse)


@cli_type
def _datasets(text: str) -> Names:
    """``<dataset>/<protocol>`` names, comma-separated."""
    names = text.split(",")
    if not all(n.count("/") == 1 and all(n.split("/")) for n in names):
        raise ValueError(f"<dataset>/<protocol>, comma-separated, not {text!r}")
    return Names(names)


def main(
    part: Annotated[str, one_of(("speed", "accuracy"), argument=True)],
    items: Annotated[Ints, opt(parser=_ints(1), metavar="INTS")] = Ints([100_000, 1_000_000]),
    rounds: Positive = 4,
    threads: Positive = 1,
    seeds: Annotated[Ints, opt(parser=_ints(0), metavar="INTS")] = Ints([0, 1, 2]),
    datasets: Annotated[Names, opt(parser=_datasets, metavar="NAMES")] = Names(
        ["filmtrust/paper", "lastfm-2k/clean"]
    ),
    eval_every: Positive = 10,
    out: OutFile = OUT,
) -> None:
    """Run one part; write it into the result file."""
    if part == "accuracy":
        accuracy(datasets, seeds, eval_every, out)
        return
    import torch

    torch.set_num_threads(threads)
    points = []
    for n in items:
        points.append(speed_point(n, rounds))
        print(json.dumps({k: v for k, v in points[-1].items() if k not in MODES}), flush=True)
        for mode in MODES:
            p = points[-1][mode]
            print(f"  {mode}: round {p['round_s']:.3f} s, server step {p['server_step_s']:.3f} s")
        data = _load(out)
        data["speed"] = {"threads": threads, "points": points}
        _save(out, data)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
