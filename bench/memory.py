"""Peak memory of simulator runs, each measured in its own child process (a clean peak RSS).

    .venv/bin/python -m bench.memory [--rounds 100] [--scale-rounds 2] [--only NAME]

Cases (``--only`` picks one):
- ``filmtrust-all``: FilmTrust, every client in every round (fraction 1), the default client
  path (gradients summed inside the batched backward), evaluated once at the end;
- ``filmtrust-all-per-client``: the same with every client's upload built and aggregated as
  the aggregator does (the path a federated run takes);
- ``synthetic-1e6x1e5``: 1,000,000 users x 100,000 items (synthetic), 10,000 clients a round.

Each child reports its peak RSS (``ru_maxrss``), the RSS after loading the data and the
seconds per round; writes bench/results/memory.json.
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench.bench_cli import OutFile, child_command, one_of, opt, positive

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "memory.json"
CASES = ("filmtrust-all", "filmtrust-all-per-client", "synthetic-1e6x1e5")
TARGETS_MB = {"filmtrust-all": 600, "filmtrust-all-per-client": None, "synthetic-1e6x1e5": 4096}


class _Options(TypedDict, total=False):
    """TrainConfig options a case sets (each left out when not set)."""

    per_client_uploads: bool


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(case: str, rounds: int) -> dict[str, Any]:
    """Run one case in this process and report its memory."""
    import torch

    from fedrecgel.data import load_split
    from fedrecgel.simulate import Simulator, TrainConfig
    from fedrecgel.synthetic import synthetic_split

    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    if case.startswith("filmtrust"):
        split = load_split("filmtrust")
        # (the option is left out when not set, so the case also runs on earlier revisions)
        own: _Options = {"per_client_uploads": True} if case.endswith("per-client") else {}
        cfg = TrainConfig(fraction=1.0, rounds=rounds, eval_every=rounds, **own)
    else:
        split = synthetic_split(1_000_000, 100_000, interactions_per_user=14.0, skew=1.0, seed=0)
        cfg = TrainConfig(fraction=0.01, rounds=rounds, eval_every=0)
    data_s = time.perf_counter() - t0
    after_data = _peak_mb()
    sim = Simulator(split, cfg)
    per_round: list[float] = []
    peaks: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rec = sim.step()
        per_round.append(time.perf_counter() - t0)
        peaks.append(_peak_mb())
    return {
        "case": case,
        "users": split.n_users,
        "items": split.n_items,
        "clients_per_round": rec.n_clients,
        "rounds": rounds,
        "per_client_uploads": getattr(cfg, "per_client_uploads", None),
        "data_seconds": data_s,
        "peak_rss_mb_after_data": after_data,
        "peak_rss_mb": _peak_mb(),
        "peak_rss_mb_after_each_round": peaks,
        "seconds_per_round": per_round,
        "target_peak_mb": TARGETS_MB[case],
    }


def main(
    rounds: Annotated[int, opt("FilmTrust rounds", parser=positive)] = 100,
    scale_rounds: Annotated[int, opt("rounds of the 1e6 x 1e5 case")] = 2,
    only: Annotated[list[str] | None, one_of(CASES)] = None,
    as_child: Annotated[str | None, one_of(CASES, "--child", hidden=True)] = None,
    out: OutFile = OUT,
) -> None:
    """Run every case in a child process; write bench/results/memory.json incrementally."""
    if as_child:
        print(json.dumps(child(as_child, rounds)))
        return
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    for case in only or CASES:
        case_rounds = scale_rounds if case.startswith("synthetic") else rounds
        proc = subprocess.run(
            [*child_command(__file__), "--child", case, "--rounds", str(case_rounds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            results[case] = {"case": case, "error": proc.stderr.strip().splitlines()[-3:]}
        else:
            results[case] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps({k: v for k, v in results[case].items() if "each" not in k}))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
