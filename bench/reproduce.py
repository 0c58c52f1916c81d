"""Reproduction of the paper's table through the CLI: FedRecGEL and FedNCF, 3 datasets, 3 seeds.

    .venv/bin/python -m bench.reproduce [--data-dir ../shared/datasets] [--rounds 100]
        [--seeds 0,1,2] [--datasets filmtrust,amazon-video,lastfm-2k] [--protocols paper,validation]

Each (dataset, method, protocol) is one ``fedrec train`` call with all seeds; its
results.json lands in bench/results/reproduce/<dataset>/<method>-<protocol>/. A finished
configuration is not run again (delete its folder to redo it). ``paper`` is the paper's split
(latest item held out for test, best test round reported); ``validation`` also holds out the
second-latest item and reports the test figure at the round chosen on it.
Then ``bench/report.py`` turns the JSON into docs/RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_cli import Positive, default_data_dir
from fedrecgel.clitools import option_flag
from fedrecgel.config import DEFAULTS
from fedrecgel.train_runs import OVERRIDDEN

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "reproduce"

#: (rho_sh, rho_ns) the authors used per dataset (the paper's settings)
RHO = {"filmtrust": (0.02, 0.02), "amazon-video": (0.01, 0.2), "lastfm-2k": (0.01, 0.01)}
METHODS = ("fedrecgel", "fedncf")


def main(
    data_dir: Path | None = default_data_dir(),
    rounds: Positive = DEFAULTS.rounds,
    seeds: str = "0,1,2",
    datasets: str = ",".join(RHO),
    methods: str = ",".join(METHODS),
    protocols: str = "paper,validation",
) -> None:
    """Run every missing configuration."""
    fedrec = Path(sys.executable).with_name("fedrec")
    for dataset in datasets.split(","):
        rho_sh, rho_ns = RHO[dataset]
        for protocol in protocols.split(","):
            for method in methods.split(","):
                out = OUT / dataset / f"{method}-{protocol}"
                if (out / "results.json").exists():
                    print(f"skip {out} (done)")
                    continue
                cmd = [
                    str(fedrec),
                    "train",
                    "--dataset",
                    dataset,
                    "--data-dir",
                    str(data_dir),
                    "--method",
                    method,
                    "--rounds",
                    str(rounds),
                    "--seeds",
                    seeds,
                    *[
                        arg
                        for name, rho in (("rho_sh", rho_sh), ("rho_ns", rho_ns))
                        if name not in OVERRIDDEN.get(method, {})  # 0 in the method: refused
                        for arg in (option_flag(name), str(rho))
                    ],
                    "--out",
                    str(out),
                    "--quiet",
                    "--validation" if protocol == "validation" else "--no-validation",
                ]
                print(" ".join(cmd[1:]), flush=True)
                t0 = time.time()
                subprocess.run(cmd, check=True)
                summary = json.loads((out / "results.json").read_text())["summary"]
                print(
                    f"  {time.time() - t0:.0f}s  "
                    + "  ".join(
                        f"{k}={v:.4f}" for k, v in summary.items() if k.endswith("hr@10.mean")
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
