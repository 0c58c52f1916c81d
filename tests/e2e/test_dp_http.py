"""A differentially private run over HTTP with real processes: the aggregator and two client
workers on loopback (SQLite, no Redis), FilmTrust, Poisson cohorts, central DP, and a target
epsilon that stops the run after two of its five rounds. Every round's epsilon in the history
is the accountant's for the run's plan, and /metrics shows the last one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedrecgel.accountant import plan_privacy
from fedrecgel.config import RunParams
from fedrecgel.data import Split, load_split
from fedrecgel.simulate import TrainConfig
from harness.parity import start_workers
from services.launcher import UpOptions, cluster
from tests.support.loopback import free_port

pytestmark = pytest.mark.slow

DATASET = "filmtrust"
DP = TrainConfig(rounds=5, sampling="poisson", dp_noise=1.0, dp_clip=1.0, shards=2)


def _run(tmp_path: Path, split: Split, run: RunParams, read: str) -> tuple[dict[str, Any], Any]:
    """The aggregator and two workers on loopback run ``run`` to its end: its history, and
    what GET ``read`` answered then (JSON, or text for /metrics)."""
    opts = UpOptions(
        run=run,
        workers=2,
        aggregator_port=free_port(),
        workdir=tmp_path,
        recommend=False,
        worker_poll_max_s=0.5,
        startup_timeout_s=300.0,
    )
    with cluster(opts) as c:
        c.start_aggregator()
        start_workers(c, split.n_users)
        c.start_run(split.n_items)
        history = c.wait_complete(600.0)
        got = httpx.get(f"{c.agg_url}{read}", headers=c.operator_headers(), timeout=30)
    return history, got.text if read == "/metrics" else got.json()


def test_a_dp_run_over_http_finishes_within_its_target_epsilon(tmp_path: Path) -> None:
    split = load_split(DATASET)
    plan = plan_privacy(DP.run_params(), split.n_users)
    assert plan is not None
    target = (plan.epsilon(2) + plan.epsilon(3)) / 2  # room for exactly two rounds
    run = DP.run_params(dataset=DATASET, deadline_s=3600.0, target_epsilon=target)
    history, metrics = _run(tmp_path, split, run, "/metrics")
    assert history["planned_rounds"] == 2
    rounds = history["rounds"]
    assert [r["round_id"] for r in rounds] == [1, 2]
    assert [r["epsilon"] for r in rounds] == pytest.approx(
        [plan.epsilon(1), plan.epsilon(2)], rel=1e-9
    )
    assert rounds[-1]["epsilon"] <= target
    assert all(r["metrics"] and 0.0 <= r["metrics"]["hr@10"] <= 1.0 for r in rounds)
    m = re.search(r"^fedrec_agg_dp_epsilon (\S+)$", metrics, re.M)
    assert m is not None and float(m.group(1)) == pytest.approx(rounds[-1]["epsilon"], rel=1e-6)


def test_a_dp_run_with_a_prior_share_ranks_with_counts_released_under_its_budget(
    tmp_path: Path,
) -> None:
    """dp_prior_share over HTTP: the workers report bounded counts, the aggregator fixes them
    once with noise, every round's epsilon is the plan's with the release composed in, and the
    evaluated versions are ranked with the released prior."""
    split = load_split(DATASET)
    run = DP.run_params(
        dataset=DATASET, deadline_s=3600.0, rounds=2, dp_noise=None, target_epsilon=3.0
    ).model_copy(update={"dp_prior_share": 0.5})
    plan = plan_privacy(run, split.n_users)
    assert plan is not None and plan.prior_noise > 0
    history, prior = _run(tmp_path, split, run, "/v1/runs/current/prior")
    rounds = history["rounds"]
    assert [r["epsilon"] for r in rounds] == pytest.approx(
        [plan.epsilon(1), plan.epsilon(2)], rel=1e-9
    )
    assert plan.epsilon(0) == pytest.approx(1.5, rel=1e-3) and rounds[-1]["epsilon"] <= 3.0
    assert prior["enabled"] and prior["complete"] and prior["counted"] == split.n_users
    counts = prior["counts"]
    assert len(counts) == split.n_items and min(counts) >= 0
    # each user counted at most 10 items, and the noise (std about 6.6) went on every item
    assert sum(counts) != sum(min(10, len(set(split.user_train(u)))) for u in range(split.n_users))
    assert all("prior_weight" in r["metrics"] for r in rounds)
