"""The server's decoupled weight decay (``server_weight_decay``): AdamW's rule, on the score
network's weight matrices only."""

from __future__ import annotations

import torch

from fedrecgel.config import RunParams
from fedrecgel.server_strategy import strategy_of
from fedrecgel.strategy import ServerOptConfig, ServerOptimizer


def _params() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "item_gmf": torch.randn(5, 3, generator=gen),
        "tower.0.weight": torch.randn(4, 6, generator=gen),
        "tower.0.bias": torch.randn(4, generator=gen),
    }


def test_adam_with_weight_decay_is_torchs_adamw_on_the_score_networks_weights_only() -> None:
    params = _params()
    ours = {k: v.clone() for k, v in params.items()}
    weight = torch.nn.Parameter(params["tower.0.weight"].clone())
    rest = [torch.nn.Parameter(params[k].clone()) for k in ("item_gmf", "tower.0.bias")]
    adamw = torch.optim.AdamW([weight], lr=0.01, weight_decay=3.0)
    adam = torch.optim.Adam(rest, lr=0.01)
    opt = ServerOptimizer(ServerOptConfig(lr=0.01, weight_decay=3.0))
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
        opt.step(ours, grads)
        weight.grad = grads["tower.0.weight"].clone()
        for p, k in zip(rest, ("item_gmf", "tower.0.bias"), strict=True):
            p.grad = grads[k].clone()
        adamw.step()
        adam.step()
    torch.testing.assert_close(ours["tower.0.weight"], weight.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours["item_gmf"], rest[0].detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours["tower.0.bias"], rest[1].detach(), rtol=1e-6, atol=1e-7)


def test_weight_decay_shrinks_the_weight_matrices_and_leaves_biases_and_item_rows() -> None:
    params = _params()
    before = {k: v.clone() for k, v in params.items()}
    opt = ServerOptimizer(ServerOptConfig(name="sgd", lr=0.1, weight_decay=2.0))
    opt.step(params, {k: torch.zeros_like(v) for k, v in params.items()})
    torch.testing.assert_close(params["tower.0.weight"], before["tower.0.weight"] * 0.8)
    assert torch.equal(params["item_gmf"], before["item_gmf"])
    assert torch.equal(params["tower.0.bias"], before["tower.0.bias"])


def test_the_run_setting_reaches_the_server_optimizer() -> None:
    strategy = strategy_of(RunParams(server_weight_decay=3.0))
    assert strategy.optimizer.cfg.weight_decay == 3.0  # type: ignore[attr-defined]
    assert strategy_of(RunParams()).optimizer.cfg.weight_decay == 0.0  # type: ignore[attr-defined]
