"""``server_update=lazy``: the server's Adam steps only the item rows a round touched, their
moments decayed over the steps they missed. What equals the dense step (a touched row's
moments and increment; everything when every row is touched each step) and what does not
(the dense step moves an untouched row on its old momentum, the lazy one leaves it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fedrecgel.cohort import select_cohort
from fedrecgel.config import RunParams
from fedrecgel.server_strategy import strategy_of
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import (
    ServerOptConfig,
    ServerOptimizer,
    nonzero_rows,
    touched_rows,
)
from fedrecgel.synthetic import synthetic_split
from services.aggregator.app import create_app
from services.cli import app
from tests.support.aggregator import make_settings, operator_headers, register, sqlite_url

N_ROWS, DIM = 7, 3
#: rows touched at steps 1..6 (row 6 never: it must never move)
TOUCHED = [[0, 1, 2, 3], [0, 1], [0, 2], [0], [0, 1, 2, 3, 4], [0, 3]]


def _params(dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "item_gmf": torch.randn(N_ROWS, DIM, generator=gen, dtype=dtype),
        "tower.0.weight": torch.randn(4, 6, generator=gen, dtype=dtype),
    }


def _grads(rows: list[int], gen: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.zeros(N_ROWS, DIM, dtype=dtype)
    g[rows] = torch.randn(len(rows), DIM, generator=gen, dtype=dtype)
    return {"item_gmf": g, "tower.0.weight": torch.randn(4, 6, generator=gen, dtype=dtype)}


def _pair(**cfg: object) -> tuple[ServerOptimizer, ServerOptimizer]:
    dense = ServerOptimizer(ServerOptConfig(lr=0.05, **cfg))  # type: ignore[arg-type]
    lazy = ServerOptimizer(ServerOptConfig(lr=0.05, update="lazy", **cfg))  # type: ignore[arg-type]
    return dense, lazy


def test_every_row_touched_every_step_is_the_dense_step_bit_for_bit() -> None:
    dense, lazy = _pair(weight_decay=0.5, warmup=2)
    pd, pl = _params(torch.float32), _params(torch.float32)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = _grads(list(range(N_ROWS)), gen, torch.float32)
        dense.step(pd, grads)
        lazy.step(pl, grads)
    for k in pd:
        assert torch.equal(pd[k], pl[k]), k
    for k in ("item_gmf.exp_avg", "item_gmf.exp_avg_sq", "tower.0.weight.exp_avg"):
        assert torch.equal(dense.state[k], lazy.state[k]), k


def test_touched_rows_take_the_dense_step_untouched_rows_stay_where_dense_drifts() -> None:
    dense, lazy = _pair()
    pd, pl = _params(), _params()
    gen = torch.Generator().manual_seed(2)
    drift = torch.zeros(N_ROWS, DIM, dtype=torch.float64)  # dense moves of untouched rows
    for t, rows in enumerate(TOUCHED, 1):
        grads = _grads(rows, gen, torch.float64)
        before_d, before_l = pd["item_gmf"].clone(), pl["item_gmf"].clone()
        dense.step(pd, grads)
        lazy.step(pl, grads)
        step_d, step_l = pd["item_gmf"] - before_d, pl["item_gmf"] - before_l
        # the touched rows: the same moments and the same increment as the dense step
        torch.testing.assert_close(step_l[rows], step_d[rows], rtol=1e-12, atol=1e-15)
        for kind in ("exp_avg", "exp_avg_sq"):
            key = f"item_gmf.{kind}"
            torch.testing.assert_close(
                lazy.state[key][rows], dense.state[key][rows], rtol=1e-12, atol=0
            )
        assert torch.equal(lazy.state["item_gmf.last_step"][rows], torch.full((len(rows),), t))
        # the untouched ones: lazy leaves them, dense moves those with a past gradient
        others = [r for r in range(N_ROWS) if r not in rows]
        assert torch.equal(step_l[others], torch.zeros(len(others), DIM, dtype=torch.float64))
        seen = {r for done in TOUCHED[: t - 1] for r in done}
        for r in others:
            assert bool((step_d[r] != 0).all()) == (r in seen), (t, r)
        drift[others] += step_d[others]
    # so the two runs differ by exactly the dense run's momentum-only moves
    torch.testing.assert_close(pd["item_gmf"] - pl["item_gmf"], drift, rtol=1e-9, atol=1e-12)
    assert float(drift[1].abs().min()) > 0 and torch.equal(drift[6], torch.zeros(DIM).double())
    # the score network is stepped densely either way
    torch.testing.assert_close(pd["tower.0.weight"], pl["tower.0.weight"], rtol=0, atol=0)


def test_given_rows_equal_the_scan_and_a_zero_row_among_them_takes_the_dense_step() -> None:
    scan, given, wider = (ServerOptimizer(ServerOptConfig(lr=0.05, update="lazy")) for _ in "abc")
    dense = ServerOptimizer(ServerOptConfig(lr=0.05))
    ps, pg, pw, pd = _params(), _params(), _params(), _params()
    gen = torch.Generator().manual_seed(3)
    for rows in TOUCHED:
        grads = _grads(rows, gen, torch.float64)
        assert nonzero_rows(grads["item_gmf"]).tolist() == rows
        scan.step(ps, grads)
        given.step(pg, grads, {"item_gmf": torch.tensor(rows)})
        # row 1 listed every step, with a zero gradient in some: it takes the dense step
        wide = sorted({*rows, 1})
        wider.step(pw, grads, touched_rows([np.array(wide)], ("item_gmf",)))
        dense.step(pd, grads)
    assert torch.equal(ps["item_gmf"], pg["item_gmf"])
    torch.testing.assert_close(pw["item_gmf"][[0, 1]], pd["item_gmf"][[0, 1]], rtol=1e-12, atol=0)
    assert not torch.equal(ps["item_gmf"][1], pw["item_gmf"][1])


def test_the_lazy_state_survives_a_checkpoint() -> None:
    gen = torch.Generator().manual_seed(4)
    steps = [_grads(rows, gen, torch.float64) for rows in TOUCHED]
    whole = ServerOptimizer(ServerOptConfig(update="lazy"))
    pw = _params()
    for g in steps:
        whole.step(pw, g)
    first = ServerOptimizer(ServerOptConfig(update="lazy"))
    pr = _params()
    for g in steps[:3]:
        first.step(pr, g)
    state = first.state_dict()
    assert state["item_gmf.last_step"].tolist() == [3, 2, 3, 1, 0, 0, 0]
    resumed = ServerOptimizer(ServerOptConfig(update="lazy"))
    resumed.load_state_dict(state)
    for g in steps[3:]:
        resumed.step(pr, g)
    assert all(torch.equal(pw[k], pr[k]) for k in pw)


def test_lazy_is_refused_for_every_optimizer_but_adam(tmp_path: Path) -> None:
    for name in ("sgd", "fedadam", "fedyogi", "fedadagrad"):
        with pytest.raises(ValueError, match=f"only defined for optimizer=adam, not {name}"):
            RunParams(server_update="lazy", optimizer=name)
        with pytest.raises(ValueError, match="only defined for adam"):
            ServerOptConfig(name=name, update="lazy")
    assert strategy_of(RunParams(server_update="lazy")).optimizer.cfg.update == "lazy"  # type: ignore[attr-defined]
    assert strategy_of(RunParams()).optimizer.cfg.update == "dense"  # type: ignore[attr-defined]
    r = CliRunner().invoke(
        app, ["train", "--server-update", "lazy", "--server-optimizer", "sgd", "--rounds", "1"]
    )
    assert r.exit_code == 2 and "server_update=lazy" in r.output, r.output
    with TestClient(create_app(make_settings(sqlite_url(tmp_path), population=5))) as client:
        register(client, list(range(5)))
        run = {"n_items": 30, "rounds": 2, "optimizer": "fedyogi", "server_update": "lazy"}
        r = client.post("/v1/runs", json=run, headers=operator_headers())
        assert r.status_code == 422 and "server_update=lazy" in r.text, r.text
        r = client.post("/v1/runs", json={**run, "optimizer": "adam"}, headers=operator_headers())
        assert r.status_code == 201 and r.json()["config"]["server_update"] == "lazy", r.text


SPLIT = synthetic_split(n_users=60, n_items=400, interactions_per_user=6.0, seed=5)


LAZY = TrainConfig(rounds=3, fraction=0.1, factor=4, layers=2, eval_every=0, server_update="lazy")


@pytest.mark.parametrize(
    "cfg",
    [
        LAZY,
        LAZY.replace(per_client_uploads=True),
        LAZY.replace(upload_grouping="worker", shards=2),
    ],
    ids=["aggregate", "per-client", "partial-sums"],
)
def test_the_simulator_steps_only_the_items_of_the_rounds_samples(cfg: TrainConfig) -> None:
    sim, dense = Simulator(SPLIT, cfg), Simulator(SPLIT, cfg.replace(server_update="dense"))
    for r in range(1, 4):
        before = {k: sim.shared[k].clone() for k in ("item_gmf", "item_mlp")}
        dense_before = dense.shared["item_gmf"].clone()
        cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, r, sampling=cfg.sampling)
        items = np.unique(np.concatenate([s[0].ravel() for s in sim.samples_for(cohort, r)]))
        sim.step()
        dense.step()
        for k, was in before.items():
            moved = (sim.shared[k] != was).any(dim=1).nonzero().squeeze(1).numpy()
            assert set(moved.tolist()) <= set(items.tolist()), (r, k)
            if k == "item_gmf":  # (an MLP row's gradient may be zero behind dead ReLUs)
                assert set(moved.tolist()) == set(items.tolist()), r
        dense_moved = (dense.shared["item_gmf"] != dense_before).any(dim=1).sum()
        if r > 1:  # dense also moves rows touched before, on their momentum
            assert int(dense_moved) > len(items)
    assert not torch.equal(sim.shared["item_gmf"], dense.shared["item_gmf"])
