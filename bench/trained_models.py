"""Trained models for the serving benchmarks, cached on disk between runs.

``amazon-video``: the simulator's default NCF (FedRecGEL) trained for a few tens of rounds on
Amazon-Video (about 12k items). ``synthetic-1m``: the same model trained briefly on synthetic
data with 1,000,000 items (``fedrecgel.synthetic``). Each cache file holds the shared
parameters, the private user embeddings of every user, and the split's test items, so the
benchmarks rank with real users of a real training run.

    python -m bench.trained_models amazon-video [--rounds 30]
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from bench.bench_cli import one_of, opt, positive
from fedrecgel.model import ModelConfig
from fedrecgel.simulate import Simulator, TrainConfig

ROOT = Path(__file__).resolve().parent.parent

CACHE = Path(os.environ.get("FEDREC_BENCH_CACHE", ROOT / "bench" / "results" / "cache"))

SPECS: dict[str, dict[str, Any]] = {
    "amazon-video": {"rounds": 30, "fraction": 0.1},
    # 1e6 items: a few rounds of a large cohort; enough for the item tables to move away from
    # their initial values where users interacted
    "synthetic-1m": {"rounds": 4, "fraction": 0.2, "users": 20_000, "items": 1_000_000},
}


def _split(name: str) -> Any:
    if name == "synthetic-1m":
        from fedrecgel.synthetic import synthetic_split

        spec = SPECS[name]
        return synthetic_split(spec["users"], spec["items"], interactions_per_user=20.0, seed=0)
    from fedrecgel.data import load_split

    return load_split(name, None)


def path_of(name: str) -> Path:
    """The cache file of model ``name``."""
    return CACHE / f"{name}.safetensors"


def train(name: str, rounds: int | None = None) -> Path:
    """Train model ``name`` with the simulator and write its cache file."""
    spec = SPECS[name]
    split = _split(name)
    cfg = TrainConfig(rounds=rounds or spec["rounds"], fraction=spec["fraction"], eval_every=0)
    sim = Simulator(split, cfg)
    t0 = time.perf_counter()
    result = sim.run(lambda r: print(f"round {r.round} loss {r.loss:.4f} {r.seconds:.1f}s"))
    test, _ = sim.evaluate()
    users = np.arange(split.n_users, dtype=np.int64)
    tensors = {f"shared/{k}": v.contiguous() for k, v in sim.shared.items()}
    tensors |= {f"private/{k}": v.contiguous() for k, v in sim.store.params(users).items()}
    tensors["test_items"] = torch.from_numpy(np.asarray(split.test_items, dtype=np.int64))
    tensors["test_negatives"] = torch.from_numpy(np.asarray(split.test_negatives, dtype=np.int64))
    meta = {
        "name": name,
        "cfg": sim.model_cfg.__dict__,
        "rounds": len(result.rounds),
        "train_s": round(time.perf_counter() - t0, 1),
        "test": test,
    }
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path_of(name).with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"info": json.dumps(meta)})
    tmp.replace(path_of(name))
    print(name, "test", test)
    return path_of(name)


def load(name: str, train_if_missing: bool = True) -> dict[str, Any]:
    """The cached trained model ``name`` (trained first when missing)."""
    p = path_of(name)
    if not p.exists():
        if not train_if_missing:
            raise FileNotFoundError(p)
        train(name)
    from safetensors import safe_open

    with safe_open(str(p), "pt") as fh:
        meta = json.loads((fh.metadata() or {})["info"])
    tensors = load_file(str(p))
    data: dict[str, Any] = dict(meta)
    data["cfg"] = ModelConfig(**meta["cfg"])
    for part in ("shared", "private"):
        data[part] = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(part + "/")}
    data["test_items"] = tensors["test_items"]
    data["test_negatives"] = tensors["test_negatives"]
    return data


def main(
    name: Annotated[str, one_of(sorted(SPECS), argument=True)],
    rounds: Annotated[int | None, opt(parser=positive)] = None,
) -> None:
    """Train (or retrain) one model."""
    logging.basicConfig(level=logging.WARNING)
    train(name, rounds)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
