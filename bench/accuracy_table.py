"""The accuracy table users quote: every method on every dataset, 3 seeds, validation-selected
and best-test figures side by side.

    .venv/bin/python -m bench.accuracy_table [--cells amazon-video/paper:tuned-fedrecgel,...]
        [--seeds 0,1,2] [--data-dir ../shared/datasets] [--eval-every 10]

A cell is ``<dataset>/<protocol>:<label>``; labels:

* ``popularity``, ``random``: the reference rankings (:mod:`fedrecgel.baselines`);
* ``faithful``: FedRecGEL with ``--preset paper`` (the paper's settings, the authors' rho pair);
* ``default-fedrecgel``, ``default-fedncf``: what ``fedrec train`` runs with no preset (the
  shipped ``default`` preset, ``bench/default_rule.py``), FedNCF with SAM off;
* ``tuned-fedrecgel``, ``tuned-fedncf``, ``tuned-fedmf``: ``--preset tuned`` (the dataset's own
  ``tuned-<dataset>``, else the default learned across tuned datasets) with that method; FedNCF
  and FedMF take the same settings with SAM off (and the MF model).

Each federated cell is what ``fedrec train --dataset D --protocol P --method M --preset X
--seeds S --eval-every 10`` computes, run in this process seed by seed. Results land in
``bench/results/accuracy/<dataset>-<protocol>/<label>/seed-<seed>.json``, one file per seed;
a seed already there is not run again unless its stored settings differ from what the shipped
presets now give (a stale seed is run again: a changed preset changes its cells), and the seeds
of a cell can run in parallel processes (``--seeds 0``, ``--seeds 1``, ...). A ``tuned-`` cell
whose settings are the defaults' (a dataset without a preset of its own) is the ``default-``
cell of the same method: the same experiment, so its seeds are that cell's runs (marked
``same_as``), not trained a second time. The synthetic set is
``synthetic_split(2000, 1000, interactions_per_user=20, skew=1.0, seed=0)``. Reported seeds
(0, 1, 2) are apart from the tuning seed (100). ``bench/report.py`` turns the JSON into
docs/RESULTS.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Annotated, Any

import torch

from bench.accuracy_diagnosis import load
from bench.bench_cli import default_data_dir, opt
from fedrecgel.baselines import popularity, random_ranking
from fedrecgel.config import current_names
from fedrecgel.data import Split
from fedrecgel.presets import PRESETS_FILE, resolve, stored
from fedrecgel.simulate import RunResult, Simulator, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "accuracy"
#: federated cells: label -> (method, preset)
FEDERATED = {
    "faithful": ("fedrecgel", "paper"),
    "default-fedrecgel": ("fedrecgel", "default"),
    "default-fedncf": ("fedncf", "default"),
    "tuned-fedrecgel": ("fedrecgel", "tuned"),
    "tuned-fedncf": ("fedncf", "tuned"),
    "tuned-fedmf": ("fedmf", "tuned"),
}
LABELS = ("popularity", "random", *FEDERATED)
DATASETS = ("amazon-video/paper", "lastfm-2k/clean", "filmtrust/paper", "lastfm-2k/paper")
SYNTHETIC = "synthetic/paper"
#: the synthetic set with taste groups (bench/accuracy_diagnosis.py's SYNTHETIC_TASTES)
TASTES = "synthetic-tastes/paper"


def config_of(label: str, split: Split, eval_every: int) -> TrainConfig:
    """The run ``fedrec train --method M --preset X`` makes for this cell, with the shipped
    presets only (the table reports what ships, whatever a user saved)."""
    method, preset = FEDERATED[label]
    settings = resolve(preset, split.name, PRESETS_FILE)
    return TrainConfig(method=method, eval_every=eval_every, **settings)  # type: ignore[arg-type]


def record(res: RunResult, seed: int) -> dict[str, Any]:
    """What the table and the learning-curve plots need of one run."""
    return {
        "seed": seed,
        "config": res.config,
        "wall_seconds": res.wall_seconds,
        "selected": res.selected(),
        "best_test": res.best_test(),
        "curve": [
            {"round": r.round, "val_hr@10": r.val["hr@10"], "test_hr@10": r.test["hr@10"]}
            for r in res.rounds
            if r.val
        ],
    }


#: settings that change how a run is computed, never what it computes (parity-tested)
EXECUTION_ONLY = frozenset({"shards", "per_client_uploads", "grouped_uploads", "upload_grouping"})


def same_settings(stored_config: dict[str, Any], cfg: TrainConfig) -> bool:
    """Whether a stored run's config trains what ``cfg`` trains. A setting the stored config
    lacks did not exist when it ran: the run had that setting's default, which is the
    paper's behaviour, as every added setting's default is."""
    defaults, stored_config = TrainConfig().model_dump(), current_names(stored_config)
    for name, want in cfg.model_dump().items():
        if name in EXECUTION_ONLY or name in ("seed", "kind"):  # the kind is the method's
            continue
        have = stored_config.get(name, defaults[name])
        if isinstance(want, float) and isinstance(have, (int, float)):
            if not math.isclose(want, have, rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif have != want:
            return False
    return True


def cell_dir(key: str, label: str) -> Path:
    """Where the seeds of one cell are stored, one JSON file each."""
    return OUT / key.replace("/", "-") / label


def settings_from(label: str, split: Split) -> str:
    """Which preset a federated cell's settings come from."""
    if label == "faithful":
        return "paper"
    if label.startswith("default-"):
        return "default"
    return f"tuned-{split.name}" if f"tuned-{split.name}" in stored(PRESETS_FILE) else "default"


def reuse_default(key: str, label: str, cfg: TrainConfig, path: Path) -> bool:
    """Store the ``default-`` cell's seed as this ``tuned-`` cell's when both train the same
    settings (True), else leave it to be run (False)."""
    twin = cell_dir(key, label.replace("tuned-", "default-", 1)) / path.name
    if not twin.exists():
        return False
    data = json.loads(twin.read_text())
    if not same_settings(data["config"], cfg):
        return False
    data.update(label=label, preset="tuned", same_as=twin.parent.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{key} {label} seed {cfg.seed}: the same settings as {twin.parent.name}, taken from it")
    return True


def run_cell(key: str, label: str, split: Split, seeds: list[int], eval_every: int) -> None:
    """Run the seeds of one cell not stored yet (seeds of a cell may run in parallel
    processes: each writes its own file)."""
    folder = cell_dir(key, label)
    for seed in seeds:
        path = folder / f"seed-{seed}.json"
        cfg = config_of(label, split, eval_every).replace(seed=seed) if label in FEDERATED else None
        if path.exists():
            if cfg is None or same_settings(json.loads(path.read_text())["config"], cfg):
                continue
            print(f"{key} {label} seed {seed}: stored settings are stale")
        if cfg is not None and label.startswith("tuned-") and reuse_default(key, label, cfg, path):
            continue
        t0 = time.perf_counter()
        data: dict[str, Any] = {"dataset": key, "label": label, "eval_every": eval_every}
        if label == "popularity":
            res = popularity(split)
        elif label == "random":
            res = random_ranking(split, seed=seed)
        else:
            assert cfg is not None
            data["method"], data["preset"] = FEDERATED[label]
            data["settings_from"] = settings_from(label, split)
            keys = ("rounds", "server_lr", "client_lr", "optimizer", "local_steps")
            data["settings"] = {k: getattr(cfg, k) for k in keys} | dict(
                zip(("rho_sh", "rho_ns"), cfg.effective_rho(), strict=True)
            )
            res = Simulator(split, cfg).run()
        data.update(record(res, seed))
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        sel = res.selected() or {}
        print(
            f"{key} {label} seed {seed}: selected HR@10 {sel.get('hr@10', float('nan')):.4f} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
        if label == "popularity":
            break  # deterministic: one run stands for every seed


#: every cell, in the order run
CELLS = ",".join(f"{d}:{label}" for d in (*DATASETS, SYNTHETIC, TASTES) for label in LABELS)


def main(
    data_dir: Path | None = default_data_dir(),
    seeds: str = "0,1,2",
    eval_every: int = 10,
    cells: Annotated[
        str, opt("comma-separated <dataset>/<protocol>:<label>, in the order to run")
    ] = CELLS,
) -> None:
    torch.set_num_threads(int(os.environ.get("FEDREC_THREADS", "1")))
    seed_list = [int(s) for s in seeds.split(",")]
    splits: dict[str, Split] = {}
    for cell in cells.split(","):
        key, label = cell.split(":")
        if label not in LABELS:
            raise SystemExit(f"unknown label {label!r}; one of {', '.join(LABELS)}")
        if key not in splits:
            splits[key] = load(key, data_dir)
        try:
            run_cell(key, label, splits[key], seed_list, eval_every)
        except ValueError as err:  # e.g. no tuned preset yet
            print(f"{key} {label}: skipped ({err})", flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
