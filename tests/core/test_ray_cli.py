"""`fedrec train --backend ray`: what it refuses (with a message, before anything starts), the
shard actor's checkpoint on its own, and a run on a two-node Ray cluster joined with --address
that writes the numbers of the in-process run with the same shards and upload grouping."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.ray_backend import ray_missing
from fedrecgel.ray_shard import (
    CheckpointError,
    ShardActor,
    ShardData,
    checkpoint_path,
    read_checkpoint,
    save_checkpoint,
)
from fedrecgel.simulate import TrainConfig
from fedrecgel.synthetic import synthetic_split

runner = CliRunner()
RAY_MISSING = ray_missing()
needs_ray = pytest.mark.skipif(
    RAY_MISSING is not None, reason=f"{RAY_MISSING} (scripts/bootstrap.sh installs it)"
)
SMALL = ["--rounds", "2", "--fraction", "0.05", "--factor", "8", "--layers", "2", "--quiet"]


def _train(*args: str) -> Any:
    return runner.invoke(app, ["train", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "popularity"], "--method popularity is not one"),
        (["--method", "central"], "--method central is not one"),
        (["--dp-noise", "1.0"], "cannot run differential privacy"),
        (["--target-epsilon", "5"], "cannot run differential privacy"),
        (["--secure-aggregation", "dense"], "cannot run --secure-aggregation"),
        (["--clip", "1.0"], "cannot run --clip"),
        (["--upload-grouping", "client"], "per-client uploads are not sent through the actors"),
    ],
)
def test_the_ray_backend_refuses_what_it_cannot_run(
    args: list[str], message: str, tmp_path: Path
) -> None:
    r = _train("--backend", "ray", *args, *SMALL, "--out", str(tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_backend_options_out_of_place_are_refused(tmp_path: Path) -> None:
    for args, message in (
        (["--backend", "spark"], "--backend must be one of inprocess, ray"),
        (["--address", "auto"], "--address is a setting of --backend ray"),
        (["--checkpoint-dir", str(tmp_path)], "--checkpoint-dir is a setting of --backend ray"),
        (["--method", "random", "--shards", "2"], "--method random has none"),
        (["--shards", "0"], "--shards"),
    ):
        r = _train(*args, *SMALL, "--out", str(tmp_path / "o"))
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output


def test_without_ray_the_backend_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    r = _train("--backend", "ray", *SMALL, "--out", str(tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert "pip install 'fedrecgel[distributed]'" in r.output and "Traceback" not in r.output


@needs_ray
def test_an_address_where_nothing_answers_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _train("--backend", "ray", "--address", f"127.0.0.1:{port}", *SMALL)
    assert r.exit_code == 2, r.output
    assert f"nothing answers at 127.0.0.1:{port}" in r.output and "ray start --head" in r.output


SPLIT = synthetic_split(n_users=40, n_items=60, interactions_per_user=8.0, n_test_negatives=20)


def _actor(folder: Path, run_id: str = "run-a", resume: bool = False) -> ShardActor:
    cfg = TrainConfig(factor=4, layers=1, shards=2)
    return ShardActor(
        ShardData.of(SPLIT, 1, 2),
        cfg.model(SPLIT.n_items),
        cfg.sam(),
        cfg.seed,
        "mean",
        str(folder),
        run_id,
        resume,
    )


def test_a_shard_actor_resumes_only_its_own_runs_checkpoint(tmp_path: Path) -> None:
    from fedrecgel.model import init_shared

    actor = _actor(tmp_path)
    shared = init_shared(actor.model, 0)
    users = [1, 5, 9]
    partial = actor.train(1, shared, users)
    assert partial.client_ids == (1, 5, 9)
    with pytest.raises(RuntimeError, match="no state of round 2"):
        actor.commit(2)
    assert actor.commit(1) == 1 and actor.commit(1) == 1  # a repeated commit is harmless
    with pytest.raises(RuntimeError, match="already stored round 1"):
        actor.train(1, shared, users)
    again = _actor(tmp_path, resume=True)
    assert again.ready()["round"] == 1
    want = actor.store.get(np.array(users))
    got = again.store.get(np.array(users))
    for k in want.params:
        assert torch.equal(got.params[k], want.params[k])
        assert torch.equal(got.exp_avg_sq[k], want.exp_avg_sq[k])
    assert torch.equal(got.step, want.step) and got.step.tolist() == [1, 1, 1]
    assert _actor(tmp_path, run_id="run-b", resume=True).ready()["round"] == 0
    assert _actor(tmp_path, resume=False).ready()["round"] == 0
    path = checkpoint_path(tmp_path, 1, 2)
    assert path.stat().st_mode & 0o777 == 0o600  # private vectors: owner only


def test_a_checkpoint_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    actor = _actor(tmp_path)
    actor.store.get(np.array([1, 3]))
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, actor.store, {"round": "1"})
    before = path.read_bytes()
    actor.store.get(np.array([5]))

    def die() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, actor.store, {"round": "2"}, before_rename=die)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "c.safetensors"
    ]
    meta, users, _ = read_checkpoint(path)
    assert meta == {"round": "1"} and users.tolist() == [1, 3]
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
        read_checkpoint(path)


@pytest.fixture
def two_nodes() -> Any:
    """A Ray cluster of two nodes with a CPU each (the test process does not join it)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1)
        yield cluster.address
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]  # ray: unannotated


@needs_ray
def test_train_on_a_two_node_cluster_writes_the_in_process_runs_numbers(
    two_nodes: str, tmp_path: Path
) -> None:
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    r = _train("--backend", "ray", "--address", two_nodes, *SMALL, "--out", str(ray_out))
    assert r.exit_code == 0, r.output
    assert "2 shard actors on the Ray cluster at" in r.output
    r = _train("--shards", "2", "--upload-grouping", "worker", *SMALL, "--out", str(local_out))
    assert r.exit_code == 0, r.output
    got, want = (json.loads((o / "results.json").read_text()) for o in (ray_out, local_out))
    assert (got["backend"], want["backend"]) == ("ray", "inprocess")
    run, ref = got["runs"][0], want["runs"][0]
    assert run["config"] == ref["config"] and run["config"]["shards"] == 2
    for a, b in zip(run["rounds"], ref["rounds"], strict=True):
        assert {**a, "seconds": 0} == {**b, "seconds": 0}
    folder = ray_out / "ray-checkpoints" / "seed-0"
    assert sorted(p.name for p in folder.iterdir()) == [
        "shard-0-of-2.safetensors",
        "shard-1-of-2.safetensors",
    ]
    # one CPU a node: a third shard has nowhere to go, and the run says so
    r = _train("--backend", "ray", "--address", two_nodes, "--shards", "3", *SMALL)
    assert r.exit_code == 2, r.output
    assert "3 shards need 3 CPUs in the Ray cluster" in r.output and "Traceback" not in r.output
