"""The ray backend (one actor per shard of users) computes the in-process simulator's run with
the same shards and ``upload_grouping="worker"`` bit for bit, and still does when its actors
die mid-run (their process killed inside a round, between writing a checkpoint and renaming it,
by ``ray.kill`` or by SIGKILL from outside): each is started again from its checkpoint and the
lost work redone from the same keyed random streams. On a local Ray with two CPUs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrecgel.ray_backend import ray_missing
from fedrecgel.simulate import RoundRecord, RunResult, Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split

RAY_MISSING = ray_missing()
pytestmark = pytest.mark.skipif(
    RAY_MISSING is not None, reason=f"{RAY_MISSING} (scripts/bootstrap.sh installs it)"
)

SPLIT = synthetic_split(
    n_users=300, n_items=200, interactions_per_user=12.0, seed=3, validation=True
)
CFG = TrainConfig(
    rounds=6,
    fraction=0.2,
    factor=8,
    layers=2,
    local_steps=2,
    weighting="samples",
    shards=2,
    upload_grouping="worker",
)


@pytest.fixture(scope="module")
def local_ray() -> Any:
    from fedrecgel.ray_backend import ray_cluster

    with ray_cluster(None, 2) as resources:
        assert resources["CPU"] == 2
        yield


@pytest.fixture(scope="module")
def reference() -> tuple[Simulator, RunResult]:
    """The in-process run at one torch thread, as each actor runs (Ray gives it one CPU): at
    two threads (this machine's default) the users' Adam moments differed from the actors' in
    the last bits, the shared parameters and the figures not."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sim = Simulator(SPLIT, CFG)
        return sim, sim.run()
    finally:
        torch.set_num_threads(before)


def _rounds(res: RunResult) -> list[tuple[Any, ...]]:
    return [(r.round, r.n_clients, r.loss, r.test, r.val) for r in res.rounds]


def _assert_same_run(sim: Simulator, res: RunResult, ref: tuple[Simulator, RunResult]) -> None:
    want_sim, want = ref
    assert _rounds(res) == _rounds(want)
    assert sorted(sim.shared) == sorted(want_sim.shared)
    for k, v in want_sim.shared.items():
        assert torch.equal(sim.shared[k], v), k


def _assert_checkpoints_hold(folder: Path, want: Simulator, rounds: int) -> None:
    """Each shard's checkpoint holds, for every one of its users, the simulator's state."""
    from fedrecgel.ray_shard import checkpoint_path, read_checkpoint

    n = want.config.shards
    for s in range(n):
        meta, users, state = read_checkpoint(checkpoint_path(folder, s, n))
        assert meta["round"] == str(rounds) and meta["shard"] == str(s)
        assert users.tolist() == list(range(s, SPLIT.n_users, n))  # all evaluated
        ref = want.store.get(users)
        assert torch.equal(state.step, ref.step)
        for part in ("params", "exp_avg", "exp_avg_sq"):
            got, exp = getattr(state, part), getattr(ref, part)
            assert sorted(got) == sorted(exp)
            for k in exp:
                assert torch.equal(got[k], exp[k]), (s, part, k)
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temp files


def test_the_ray_run_is_the_simulators_bit_for_bit(
    local_ray: Any, reference: tuple[Simulator, RunResult], tmp_path: Path
) -> None:
    from fedrecgel.ray_backend import RaySimulator

    with RaySimulator(SPLIT, CFG, tmp_path) as sim:
        assert len(set(sim.pids)) == 2 and os.getpid() not in sim.pids
        res = sim.run()
        assert sim.restarts == [0, 0]
    _assert_same_run(sim, res, reference)
    assert all(r.test and r.val for r in res.rounds)
    # the run did learn something, and each round's loss is its own
    assert len({r.loss for r in res.rounds}) == CFG.rounds
    _assert_checkpoints_hold(tmp_path, reference[0], CFG.rounds)


def test_the_ray_run_ranks_with_fitted_embeddings_as_the_simulator_does(
    local_ray: Any, tmp_path: Path
) -> None:
    """With ``rank_fit_steps`` each actor fits its users' embeddings to the evaluated version
    (keyed draws): the figures are the in-process simulator's, and not the plain run's."""
    from fedrecgel.ray_backend import RaySimulator

    cfg = CFG.replace(rounds=2, rank_fit_steps=3, rank_fit_lr=0.1)
    want = Simulator(SPLIT, cfg).run()
    with RaySimulator(SPLIT, cfg, tmp_path) as sim:
        res = sim.run()
    assert _rounds(res) == _rounds(want)
    plain = Simulator(SPLIT, CFG.replace(rounds=2)).run()
    assert [r.test for r in plain.rounds] != [r.test for r in res.rounds]


def test_actors_killed_mid_run_restart_from_their_checkpoints_and_end_the_same(
    local_ray: Any, reference: tuple[Simulator, RunResult], tmp_path: Path
) -> None:
    """Shard 0's process dies in round 2 after computing its partial sum, shard 1's in round 3
    with its new checkpoint written but not renamed; shard 0's actor is ended by ``ray.kill``
    after round 4 and shard 1's process SIGKILLed after round 5."""
    import ray

    from fedrecgel.ray_backend import RaySimulator

    sim = RaySimulator(SPLIT, CFG, tmp_path, crash={0: (2, "train"), 1: (3, "commit")})
    seen: list[tuple[int, list[int]]] = []

    def fault(rec: RoundRecord) -> None:
        seen.append((rec.round, list(sim.restarts)))
        if rec.round == 4:
            ray.kill(sim.actors[0])
        if rec.round == 5:
            os.kill(sim.pids[1], signal.SIGKILL)

    with sim:
        res = sim.run(fault)
    assert seen == [(1, [0, 0]), (2, [1, 0]), (3, [1, 1]), (4, [1, 1]), (5, [2, 1]), (6, [2, 2])]
    _assert_same_run(sim, res, reference)
    _assert_checkpoints_hold(tmp_path, reference[0], CFG.rounds)


def test_a_shard_actor_that_keeps_dying_ends_the_run_with_a_clear_error(
    local_ray: Any, tmp_path: Path
) -> None:
    import ray

    from fedrecgel.ray_backend import RaySimulator, ShardLost

    sim = RaySimulator(SPLIT, CFG, tmp_path, crash={1: (1, "train")}, max_restarts=0)
    with sim, pytest.raises(ShardLost, match="shard 1's actor died 1 times"):
        sim.run()

    def spoil(rec: RoundRecord) -> None:  # a lost actor whose checkpoint is unreadable
        ray.kill(sim.actors[0])
        (tmp_path / "shard-0-of-2.safetensors").write_bytes(b"spoilt")

    sim = RaySimulator(SPLIT, CFG, tmp_path)
    with (
        sim,
        pytest.raises(
            ShardLost, match=r"could not be started again: .*CheckpointError: cannot read"
        ),
    ):
        sim.run(spoil)


def test_what_the_ray_backend_refuses(local_ray: Any, tmp_path: Path) -> None:
    from fedrecgel.ray_backend import RaySimulator

    client = CFG.replace(upload_grouping="client", weighting="mean")
    for cfg, why in (
        (client, "upload_grouping must be worker"),
        (client.replace(dp_noise=1.0), "cannot run differential privacy"),
        (client.replace(secure_aggregation="dense"), "cannot run secure aggregation"),
        (client.replace(clip=1.0), "cannot run clip"),
        (CFG.replace(shards=3), "3 shards need 3 CPUs in the Ray cluster"),
    ):
        with pytest.raises(ValueError, match=why):
            RaySimulator(SPLIT, cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_every_user_is_in_exactly_one_shard_with_its_own_items() -> None:
    from fedrecgel.ray_shard import ShardData

    seen = []
    for s in range(3):
        data = ShardData.of(SPLIT, s, 3)
        seen += data.users.tolist()
        for i, u in enumerate(data.users):
            assert np.array_equal(data.user_train(int(u)), SPLIT.user_train(int(u)))
            assert data.test_items[i] == SPLIT.test_items[u]
        with pytest.raises(ValueError, match="not in shard"):
            data.user_train((s + 1) % 3)
    assert sorted(seen) == list(range(SPLIT.n_users))
