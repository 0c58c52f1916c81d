"""Does ``torch.compile`` (inductor, CPU) pay off on the client step's elementwise work?

    .venv/bin/python -m bench.roofline_compile [--repeats 15]

Pass 3 of one group of FilmTrust clients (the batched pass: the shared score network, the
cached item half of the first layer, backward to the private gradients only) written as one
function, compiled for that group's fixed shape, against the project's eager pass
(:mod:`fedrecgel.passes`) on the same inputs, interleaved. Writes
bench/results/roofline_compile.json: compile seconds, best and median milliseconds of each.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from torch import Tensor

from bench.bench_cli import Positive
from fedrecgel import passes
from fedrecgel.cohort import select_cohort
from fedrecgel.data import load_split
from fedrecgel.simulate import Simulator, TrainConfig

OUT = Path(__file__).resolve().parents[1] / "bench" / "results" / "roofline_compile.json"


def pass3(
    ug: Tensor, um: Tensor, ig: Tensor, item_first: Tensor, client: Tensor, labels: Tensor,
    weights: Tensor, w0u: Tensor, b0: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
    wp: Tensor, bp: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Pass 3 (private gradients at the perturbed user) in plain torch, for the compiler."""
    c, f = ug.shape
    h0 = torch.relu(item_first + (um @ w0u.T + b0)[client])
    h1 = torch.relu(h0 @ w1.T + b1)
    h2 = torch.relu(h1 @ w2.T + b2)
    logit = (ug[client] * ig) @ wp[0, :f] + h2 @ wp[0, f:] + bp
    d = (torch.sigmoid(logit) - labels) * weights
    dh1 = ((d[:, None] * wp[0, f:]) * (h2 > 0)) @ w2 * (h1 > 0)
    dh0 = (dh1 @ w1) * (h0 > 0)
    gu = torch.zeros(c, dh0.shape[1]).index_add_(0, client, dh0) @ w0u
    gg = torch.zeros(c, f).index_add_(0, client, (d[:, None] * wp[0, :f]) * ig)
    return gu, gg


def main(repeats: Positive = 15) -> None:
    """Time the eager and the compiled pass 3 and write the JSON."""
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    split = load_split("filmtrust")
    cfg = TrainConfig(eval_every=0)
    sim = Simulator(split, cfg)
    cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, 3)[:60]
    mc, sh = sim.model_cfg, sim.shared
    lay = passes.make_layout(sim.samples_for(cohort, 3), mc.n_items, sim.hp.chunk_size)
    priv = sim.store.get(cohort).params
    dense = {n: sh[n] for n in mc.dense_names()}
    ig, im = sh["item_gmf"][lay.items], sh["item_mlp"][lay.items]
    fw1 = passes.forward(mc, lay, priv, ig, im, dense, False)
    e, first = mc.mlp_dim, fw1.item_first
    assert first is not None
    inputs = (priv["user_gmf"], priv["user_mlp"], ig, first, lay.client, lay.labels)
    weights = (lay.weights, dense["tower.0.weight"][:, :e].contiguous(), dense["tower.0.bias"])
    rest = tuple(dense[n] for n in ("tower.1.weight", "tower.1.bias", "tower.2.weight"))
    rest += (dense["tower.2.bias"], dense["predict.weight"], dense["predict.bias"])
    a = inputs + weights + rest

    def eager() -> dict[str, Tensor]:
        fw3 = passes.forward(mc, lay, priv, ig, im, dense, False, fw1.item_first)
        _, d3 = passes.loss_grad(lay, fw3.logits)
        return passes.backward(mc, lay, fw3, priv, dense, False, d3, None, True)[1]

    t0 = time.perf_counter()
    comp = torch.compile(pass3, dynamic=False)
    gu, gg = comp(*a)
    compile_s = time.perf_counter() - t0
    want = eager()
    diff = max(
        float((gu - want["user_mlp"]).abs().max()), float((gg - want["user_gmf"]).abs().max())
    )
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(repeats):
        for key, fn in (("eager", eager), ("compiled", lambda: comp(*a))):
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    res = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.roofline_compile",
        "samples": len(lay.items),
        "clients": lay.n_clients,
        "compile_s": compile_s,
        "max_abs_difference": diff,
        **{f"{k}_ms_best": min(v) * 1e3 for k, v in times.items()},
        **{f"{k}_ms_median": statistics.median(v) * 1e3 for k, v in times.items()},
    }
    OUT.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
