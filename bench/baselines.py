"""Reference points for the results tables: popularity, random and item co-occurrence rankings on
every dataset and protocol (and, with --central-epochs N, the centralized NCF upper bound; slow on 2 cores).

    .venv/bin/python -m bench.baselines [--data-dir ../shared/datasets] [--central-epochs 20]

Writes bench/results/baselines.json; bench/report.py puts it in docs/RESULTS.md. Test figures
are reported at the validation-selected epoch (``selected``) and at the best test epoch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_cli import IntList, Ints, default_data_dir
from fedrecgel.baselines import CentralConfig, central, popularity, random_ranking
from fedrecgel.cooccurrence import cooccurrence
from fedrecgel.data import DATASETS, DataError, load_split
from fedrecgel.model import ModelConfig
from fedrecgel.simulate import RunResult

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "baselines.json"


def _figures(runs: list[RunResult]) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(runs)}
    for label, pick in (("selected", RunResult.selected), ("best_test", RunResult.best_test)):
        rows = [pick(r) for r in runs]
        for key in ("hr@10", "ndcg@10"):
            vals = [r[key] for r in rows if r is not None]
            if vals:
                out[f"{label}.{key}.mean"] = float(np.mean(vals))
                out[f"{label}.{key}.std"] = float(np.std(vals))
    return out


def main(
    data_dir: Path | None = default_data_dir(),
    central_epochs: int = 0,
    seeds: IntList = Ints([0, 1, 2]),
) -> None:
    results: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name in DATASETS:
        for protocol in ("paper", "clean") if name == "lastfm-2k" else ("paper",):
            key = f"{name}/{protocol}"
            try:
                split = load_split(name, data_dir, validation=True, protocol=protocol)
            except DataError as err:
                print(f"{key}: skipped ({err})")
                continue
            row: dict[str, Any] = results.get(key, {})
            row["popularity"] = _figures([popularity(split)])
            row["random"] = _figures([random_ranking(split, seed=s) for s in seeds])
            co = cooccurrence(split)
            row["cooccurrence"] = {**_figures([co]), "rank": co.config["rank"]}
            if central_epochs:
                t0 = time.perf_counter()
                cfg = [
                    CentralConfig(ModelConfig(n_items=split.n_items), epochs=central_epochs, seed=s)
                    for s in seeds
                ]
                row["central"] = _figures([central(split, c) for c in cfg])
                row["central"]["epochs"] = central_epochs
                row["central"]["seconds"] = time.perf_counter() - t0
            results[key] = row
            print(
                key,
                {m: round(v.get("selected.hr@10.mean", float("nan")), 4) for m, v in row.items()},
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
