"""The server strategy of a run's settings, built in one place for the simulator and the
aggregator: :mod:`fedrecgel.strategy`'s FedAvg over the gradients with its optimizer, wrapped by a
robust mean (:mod:`fedrecgel.robust`) and by clipping when the settings ask for them (the DP
wrapper, :func:`fedrecgel.privacy.with_privacy`, goes around what this returns)."""

from __future__ import annotations

from dataclasses import replace

from fedrecgel.config import RunParams
from fedrecgel.robust import RobustMean
from fedrecgel.strategy import ClipUpdates, ServerOptConfig, Strategy, fedavg_of


def strategy_of(params: RunParams) -> Strategy:
    """The server strategy of a run's settings: optimizer with its constants and schedule,
    weighting, clipping (the simulator and the aggregator both build it here)."""
    opt = ServerOptConfig.preset(params.optimizer, params.server_lr)
    opt = replace(
        opt,
        beta1=opt.beta1 if params.server_beta1 is None else params.server_beta1,
        beta2=opt.beta2 if params.server_beta2 is None else params.server_beta2,
        momentum=params.server_momentum,
        warmup=params.server_warmup,
        decay=params.server_decay,
        total=params.rounds,
        weight_decay=params.server_weight_decay,
        update=params.server_update,
    )
    s = fedavg_of(opt, params.weighting, None)
    if params.server_mean != "mean":  # a coordinate-wise robust mean (fedrecgel/robust.py)
        s = RobustMean(s, params.server_mean, params.trim_fraction)
    return s if params.clip is None else ClipUpdates(s, params.clip)
