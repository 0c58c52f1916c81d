"""Why the validation figure falls after its peak: the score network's weights, measured along a
run with and without the server's weight decay.

    nice -n 5 .venv/bin/python -m bench.score_network_diagnosis [--datasets synthetic-tastes,...]
        [--rounds 300] [--every 10] [--weight-decay 10] [--data-dir ../shared/datasets]

For each dataset, the settings the default preset had before ``server_weight_decay`` existed
(server Adam 0.003, 5 private local steps at client lr 0.01) are run twice on the tuning seed
(100), validation items only: without decay, and with ``server_weight_decay`` (decoupled decay
of the score network's weight matrices at each server step). Every ``--every`` rounds:

* ``val_hr``: validation HR@10; ``val_hr_mean_user``: the same with every user's private
  embeddings replaced by the population's mean (what is left of one ranking for everyone);
* ``tower_norm``: Frobenius norm of the score network's weight matrices together (the MLP tower
  and the prediction layer), ``item_norm``: of the two item tables together;
* ``logit_spread``: mean over users of the standard deviation of the candidates' logits (how
  sharply the model separates the 100 candidates);
* ``loss``: the round's mean client training loss.

Writes ``bench/results/score_network_diagnosis.json``; ``bench/report.py`` tabulates and plots
it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import torch

from bench.accuracy_diagnosis import SEED, measure
from bench.bench_cli import OutFile, Positive, cli_type, default_data_dir, opt
from fedrecgel.data import Split
from fedrecgel.metrics import KS, candidate_logits, means, metric_sums
from fedrecgel.model import ITEM_TABLES, Scorer
from fedrecgel.simulate import Simulator, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "score_network_diagnosis.json"


class _Preset(TypedDict):
    """The TrainConfig settings :data:`BEFORE` replaces."""

    server_lr: float
    local_steps: int
    client_lr: float


#: the default preset's settings before the server's weight decay was added to it
BEFORE: _Preset = {"server_lr": 0.003, "local_steps": 5, "client_lr": 0.01}


def configs(rounds: int, weight_decay: float) -> dict[str, TrainConfig]:
    """The two runs compared on a dataset."""
    base = TrainConfig(seed=SEED, rounds=rounds, eval_every=0, **BEFORE)
    return {
        "no weight decay": base,
        f"server weight decay {weight_decay:g}": base.replace(server_weight_decay=weight_decay),
    }


def _norm(tensors: list[torch.Tensor]) -> float:
    total = sum((t.double() ** 2).sum() for t in tensors)
    assert isinstance(total, torch.Tensor), "no tensors"
    return float(torch.sqrt(total))


def instrument(split: Split, cfg: TrainConfig, every: int) -> list[dict[str, Any]]:
    """Run ``cfg`` on ``split``; the instruments every ``every`` rounds (and at round 1)."""
    sim = Simulator(split, cfg)
    assert split.val_items is not None and split.val_negatives is not None
    cand = torch.from_numpy(
        np.concatenate([split.val_items[:, None], split.val_negatives], 1).astype(np.int64)
    )
    out: list[dict[str, Any]] = []
    torch.set_grad_enabled(False)
    for r in range(1, cfg.rounds + 1):
        rec = sim.step()
        if r % every and r != 1:
            continue
        scorer = Scorer(sim.model_cfg, sim.shared)
        priv = sim.store.params(sim.users)
        mean_user = {k: v.mean(0, keepdim=True).expand_as(v).contiguous() for k, v in priv.items()}
        val = means(metric_sums(scorer, priv, split.val_items, split.val_negatives, KS))
        val_mean = means(metric_sums(scorer, mean_user, split.val_items, split.val_negatives, KS))
        logits = candidate_logits(scorer, priv, cand)
        weights = [v for k, v in sim.shared.items() if v.dim() >= 2 and k not in ITEM_TABLES]
        out.append(
            {
                "round": r,
                "loss": rec.loss,
                "val_hr": val["hr@10"],
                "val_hr_mean_user": val_mean["hr@10"],
                "tower_norm": _norm(weights),
                "item_norm": _norm([sim.shared[k] for k in ITEM_TABLES if k in sim.shared]),
                "logit_spread": float(logits.std(1).mean()),
            }
        )
        print(json.dumps({"round": r, "val_hr": round(val["hr@10"], 4)}), flush=True)
    torch.set_grad_enabled(True)
    return out


@cli_type
def _decay(text: str) -> float:
    """A weight decay > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not value > 0:
        raise ValueError(f"must be above 0, got {text}")
    return value


def main(
    datasets: str = "synthetic-tastes,amazon-video/paper",
    rounds: Positive = 300,
    every: Positive = 10,
    weight_decay: Annotated[float, opt(parser=_decay)] = 10.0,
    data_dir: Path | None = default_data_dir(),
    out: OutFile = OUT,
) -> None:
    """Measure and write the instruments (see the module docstring)."""
    measure(datasets, rounds, every, data_dir, out, configs(rounds, weight_decay), instrument)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
