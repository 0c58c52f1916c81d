"""Secure aggregation in the simulator: the round's aggregate goes through mask and unmask and
gives the plain aggregate, and the same model, to within the fixed-point error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.cohort import select_cohort
from fedrecgel.config import ConfigError, RunParams
from fedrecgel.secagg.aggregate import secure_mean
from fedrecgel.secagg.local import Faults
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import aggregate_gradients, clip_update
from fedrecgel.synthetic import synthetic_split

SPLIT = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
PLAIN = TrainConfig(rounds=3, fraction=0.2, factor=8, layers=2, eval_every=3)
SECURE = PLAIN.replace(secure_aggregation="dense", secagg_neighbours=3)


def _one_round_uploads(cfg: TrainConfig):  # type: ignore[no-untyped-def]
    sim = Simulator(SPLIT, cfg)
    cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, 1)
    return sim, sim.clients.step_in(sim.store, sim.shared, 1, cohort, SPLIT.user_train).uploads


@pytest.mark.parametrize("clip", [None, 0.05])
def test_the_secure_mean_is_the_plain_mean_within_the_fixed_point_step(
    clip: float | None,
) -> None:
    sim, uploads = _one_round_uploads(SECURE.replace(clip=clip))
    shapes = sim.model_cfg.shared_shapes()
    clipped = [clip_update(u, clip) for u in uploads] if clip else uploads
    plain = aggregate_gradients(clipped, shapes, "mean")
    mean = secure_mean(sim.model_cfg, sim.params, 1, uploads)
    assert mean.survivors == tuple(sorted(u.client_id for u in uploads))
    step = sim.params.secagg_fixed_point().step
    for name in shapes:
        err = (mean.grads[name].double() - plain[name].double()).abs()
        # half a step of rounding plus float32 rounding of the result
        assert float((err - 1e-6 * plain[name].double().abs()).max()) <= step, name
    assert mean.loss == pytest.approx(float(np.mean([u.loss for u in uploads])), abs=1e-6)
    some = next(iter(plain.values()))
    assert float(some.abs().max()) > 1e3 * step  # the gradients are far above the step


def test_with_dropouts_after_masking_the_mean_is_the_survivors_mean() -> None:
    sim, uploads = _one_round_uploads(SECURE)
    ids = sorted(u.client_id for u in uploads)
    gone, silent = ids[2], ids[5]
    faults = Faults(no_input=frozenset({gone}), no_reveal=frozenset({silent}))
    mean = secure_mean(sim.model_cfg, sim.params, 1, uploads, faults)
    assert mean.dropped == (gone,) and silent in mean.survivors
    plain = aggregate_gradients(
        [u for u in uploads if u.client_id != gone], sim.model_cfg.shared_shapes(), "mean"
    )
    for name, g in plain.items():
        torch.testing.assert_close(mean.grads[name], g, atol=1e-6, rtol=1e-5)


def test_a_run_with_secure_aggregation_trains_the_same_model() -> None:
    plain, secure = Simulator(SPLIT, PLAIN), Simulator(SPLIT, SECURE)
    a, b = plain.run(), secure.run()
    for name, p in plain.shared.items():
        # Adam divides by the root of the second moment: a mean off by 1e-10 moves a
        # parameter by far less than 1e-5
        torch.testing.assert_close(secure.shared[name], p, atol=1e-5, rtol=0)
    assert b.rounds[-1].test == pytest.approx(a.rounds[-1].test, abs=1e-6)
    assert [r.loss for r in b.rounds] == pytest.approx([r.loss for r in a.rounds], abs=1e-6)
    assert secure.params.secure_aggregation == "dense"


def test_secure_aggregation_refuses_settings_it_cannot_honour() -> None:
    with pytest.raises(ConfigError, match="weighting"):
        SECURE.replace(weighting="samples").run_params()
    with pytest.raises(ValueError, match="room"):
        RunParams(secure_aggregation="dense", secagg_range=1e6, secagg_scale_bits=48)
    RunParams(secagg_range=1e6, secagg_scale_bits=48)  # only checked when it is on


def test_a_cohort_too_small_for_a_secret_sum_is_a_clear_cli_error() -> None:
    with pytest.raises(ValueError, match="at least 2 clients"):
        Simulator(SPLIT, SECURE.replace(fraction=0.01))
    r = CliRunner().invoke(
        app, ["train", "--secure-aggregation", "dense", "--fraction", "0.0001", "--rounds", "1"]
    )
    assert r.exit_code != 0 and "at least 2 clients" in r.output, r.output
    assert "Traceback" not in r.output
