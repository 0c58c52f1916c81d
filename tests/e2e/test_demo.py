"""The demo path on real processes: `fedrec up` trains over HTTP, then a user's device asks its
worker for recommendations, the worker asks recommend_api, and the answer is the exact top-k of
the latest model for that user's private vector (with the run's popularity prior at the weight
the aggregator chose)."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from fedrecgel.data import load_split
from fedrecgel.model import ModelConfig, Scorer
from fedrecgel.prior import log_prior
from fedrecgel.rank_fit import ranking_params
from fedrecgel.run_config import RunConfig
from fedrecgel.wire import decode_model
from harness.procs import alive, descendants, fedrec_up_on, spawned, wait_for_text
from services.client_sim.store import WorkerStore
from tests.support.loopback import free_port

pytestmark = pytest.mark.slow


def test_demo_trains_then_serves_exact_recommendations(tmp_path: Path) -> None:
    agg, rec, http0, dash = free_port(), free_port(), free_port(2), free_port()
    http1 = http0 + 1
    workdir = tmp_path / "up"
    log_path = tmp_path / "up.log"
    with (
        log_path.open("w") as log,
        spawned(
            fedrec_up_on(
                workdir, (agg, rec, http0), "--rounds", "2", "--keep-running", dashboard_port=dash
            ),
            log,
            env={**os.environ, "COLUMNS": "200"},
        ) as proc,
    ):
        text = wait_for_text(log_path, "Services are running", proc, timeout_s=400)
        assert "top-10 from recommend_api, model v2" in text
        assert "final round 2: HR@10" in text
        # the dashboard's address is shown at the start, and it shows the run
        assert f"dashboard: http://127.0.0.1:{dash}/ui/" in text
        state = httpx.get(f"http://127.0.0.1:{dash}/ui/api/state", timeout=30).json()
        assert [r["round_id"] for r in state["history"]] == [1, 2]
        # the operator token is shown as a file only its owner can read
        token_file = workdir / "operator.token"
        assert str(token_file) in text
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in text

        split = load_split("filmtrust", validation=True)  # fedrec up's workers hold it so
        # the run's popularity prior: the workers' counts summed, equal to the split's own
        prior = httpx.get(
            f"http://127.0.0.1:{agg}/v1/runs/current/prior",
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        assert prior["complete"] is True
        assert prior["counts"] == np.bincount(split.train_items, minlength=split.n_items).tolist()
        blob = httpx.get(
            f"http://127.0.0.1:{agg}/v1/models/2", headers={"Authorization": "Bearer x"}
        ).status_code
        assert blob == 401  # the aggregator's models are not public
        blob = httpx.get(
            f"http://127.0.0.1:{agg}/v1/models/2", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        assert blob == 200  # ... but the operator's token in the file opens them
        auth = {"Authorization": f"Bearer {token}"}
        info = httpx.get(f"http://127.0.0.1:{agg}/v1/rounds/current", headers=auth).json()
        run_cfg = RunConfig(**info["config"])
        cfg, shared = _model_from_db(workdir / "aggregator.db", 2)
        for user, port in ((0, http0), (3, http1)):
            r = httpx.get(
                f"http://127.0.0.1:{port}/v1/users/{user}/recommendations?k=10", timeout=30
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model_version"] == 2 and len(body["items"]) == 10
            assert body["prior_weight"] == (prior["weight"] or None)
            # brute force: the user's vector from its worker's store (as the worker's users
            # fit theirs to version 2 when the run says so), the model the aggregator stored
            # as version 2, every item scored (plus the prior's term at the weight served),
            # training items excluded
            store = WorkerStore(workdir / f"worker-{user % 2}.db")
            ids = store.load_data().user_ids
            states = store.load_states(ids.tolist())
            store.close()
            fit, hp = run_cfg.rank_fit(), run_cfg.sam()
            params = ranking_params(
                cfg, shared, states, ids, split.user_train, hp, fit, run_cfg.seed, 2
            )
            row = ids.tolist().index(user)
            private = {k: v[row : row + 1] for k, v in params.items()}
            # two rounds in, the default preset fits every user: the vector sent is not stored
            assert fit.steps > 0 and states.step[row] < fit.steps
            assert not torch.equal(private["user_gmf"][0], states.params["user_gmf"][row])
            scores = Scorer(cfg, shared).score_all(private)[0]
            if body["prior_weight"]:
                counts = np.asarray(prior["counts"], dtype=np.int64)
                scores = scores + body["prior_weight"] * log_prior(counts)
            scores[torch.from_numpy(np.unique(split.user_train(user)))] = -torch.inf
            top = torch.topk(scores, 10).indices.tolist()
            want = [str(split.item_labels[i]) for i in top]
            assert [it["item"] for it in body["items"]] == want
        # another shard's user is refused by this worker
        r = httpx.get(f"http://127.0.0.1:{http0}/v1/users/1/recommendations?k=10")
        assert r.status_code == 404
        children = descendants(proc.pid)
        assert len(children) >= 5  # aggregator, recommend_api, two workers, dashboard
        # SIGTERM ends a --keep-running instance as Ctrl-C does
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log_path.read_text()
    # everything it started is gone: no process left, the ports are free again
    assert [pid for pid in children if alive(pid)] == []
    for port in (agg, rec, http0, http1, dash):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def _model_from_db(path: Path, version: int) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a stored model version straight from the aggregator's SQLite file."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        row = con.execute(
            "SELECT b.blob FROM version_blobs b JOIN model_versions v ON v.id = b.version_pk "
            "WHERE v.version = ? AND b.kind = 'params'",
            (version,),
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    cfg, shared, v = decode_model(bytes(row[0]))
    assert v == version
    return cfg, shared


@pytest.mark.parametrize(
    ("every", "said", "unsaid"),
    [
        ("2", r"best round [23] on validation: HR@10", "no round was evaluated"),
        ("0", r"no round was evaluated \(--eval-every 0\)", "final round"),
    ],
)
def test_up_with_the_demos_settings_evaluates_the_rounds_eval_every_names(
    tmp_path: Path, every: str, said: str, unsaid: str
) -> None:
    """The demo's settings (partial sums, an evaluation every few rounds) on 3 rounds: with
    eval_every 2 rounds 2 and 3 (the last) are evaluated, and the best round is chosen among
    them; with 0 none is, and `fedrec up` says so instead of printing figures."""
    ports = (free_port(), free_port(), free_port(2))
    up = fedrec_up_on(
        tmp_path / "up",
        ports,
        *("--rounds", "3", "--eval-every", every, "--upload-grouping", "worker"),
        *("--no-recommend", "--no-dashboard"),
    )
    done = subprocess.run(
        up, capture_output=True, text=True, timeout=400, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(said, done.stderr) and unsaid not in done.stderr, done.stderr[-3000:]
    log = (tmp_path / "up" / "aggregator.log").read_text()
    evaluated = sorted({int(v) for v in re.findall(r"version (\d+) evaluated over", log)})
    assert evaluated == ([2, 3] if every == "2" else []), evaluated
