"""Federated runs the studies share (sensitivity grid, loss landscape), trained once and kept.

A finished run is saved (final shared parameters, every user's final private parameters, the
run's records) under ``runs/studies/`` (not versioned); asking again for the same dataset and
config loads it instead of training. A run is saved only when it finished, so an interrupted
study starts the unfinished run again and keeps the finished ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.simulate import RoundRecord, Simulator, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "runs" / "studies"


def run_path(dataset: str, config: TrainConfig, cache: Path = CACHE) -> Path:
    """Where the run of ``config`` on ``dataset`` is kept (named by a hash of the config): the
    parameters in ``<path>.safetensors`` (``shared.*``, ``private.*``), the run in
    ``<path>.json``, written last."""
    # only the settings away from their defaults: a new setting (at its default) keeps the key
    default = TrainConfig().model_dump()
    own = {k: v for k, v in config.model_dump().items() if v != default[k] and k != "kind"}
    blob = json.dumps(own, sort_keys=True).encode()
    return cache / dataset / f"{config.method}-{hashlib.sha256(blob).hexdigest()[:16]}.json"


def train_cached(
    split: Split, config: TrainConfig, cache: Path = CACHE, verbose: bool = True
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Any]]:
    """(final shared parameters, private parameters of users 0..n-1, the run as JSON)."""
    path = run_path(split.name, config, cache)
    tensors = path.with_suffix(".safetensors")
    if path.exists():
        flat = load_file(tensors)
        shared = {k.removeprefix("shared."): v for k, v in flat.items() if k.startswith("shared.")}
        private = {
            k.removeprefix("private."): v for k, v in flat.items() if k.startswith("private.")
        }
        return shared, private, json.loads(path.read_text())
    sim = Simulator(split, config)

    def show(rec: RoundRecord) -> None:
        if verbose and rec.val:
            print(
                f"  {config.method} rho=({config.rho_sh}, {config.rho_ns}) round {rec.round}: "
                f"val hr@10 {rec.val['hr@10']:.4f} ({rec.seconds:.1f} s)",
                flush=True,
            )

    result = sim.run(on_round=show).to_json()
    shared = {k: v.detach().clone() for k, v in sim.shared.items()}
    private = {k: v.detach().clone() for k, v in sim.store.params(sim.users).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"shared.{k}": v.contiguous() for k, v in shared.items()}
    flat.update({f"private.{k}": v.contiguous() for k, v in private.items()})
    save_file(flat, tensors)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)
    return shared, private, result
