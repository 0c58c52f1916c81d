"""The client-simulation worker against an in-memory fake aggregator (no real server)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from pydantic import SecretStr

from fedrecgel.data import Split
from fedrecgel.metrics import means
from fedrecgel.prior import bounded_counts
from fedrecgel.run_config import RunConfig
from fedrecgel.sam import PrivateState, client_rng, client_samples, cohort_step
from fedrecgel.simulate import RunResult, Simulator
from fedrecgel.synthetic import synthetic_split
from fedrecgel.wire import decode_updates, update_digest
from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.loop import follow_rounds
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import WorkerStore
from services.client_sim.worker import Worker
from tests.client_sim.worker_run import FACTOR, LAYERS, run_body, train_config
from tests.fake_aggregator import FakeAggregator, enrolment_for

SEED = 3


@pytest.fixture(scope="module")
def split() -> Split:
    return synthetic_split(n_users=60, n_items=80, seed=5, n_test_negatives=20)


@pytest.fixture(scope="module")
def sim3(split: Split) -> tuple[Simulator, RunResult]:
    """The in-process simulator after 3 rounds (what every federated run must reproduce)."""
    sim = Simulator(split, train_config(SEED))
    return sim, sim.run()


def _start(fake: FakeAggregator, split: Split, rounds: int = 3) -> None:
    fake.start_run(**run_body(split.n_items, SEED, rounds))


def _running(
    tmp_path: Path, split: Split, shards: int = 1, rounds: int = 3, **settings: Any
) -> tuple[FakeAggregator, list[Worker]]:
    """A fake aggregator with a started run and a registered worker for each of ``shards``."""
    fake = FakeAggregator()
    workers = [_worker(tmp_path, fake, split, i, shards, **settings) for i in range(shards)]
    for w in workers:
        w.register()
    _start(fake, split, rounds=rounds)
    return fake, workers


def _worker(
    tmp_path: Path, fake: FakeAggregator, split: Split, shard: int, shards: int, **settings: Any
) -> Worker:
    s = WorkerSettings(
        shard=shard,
        shards=shards,
        enrolment_token=SecretStr(enrolment_for(shard, shards)),
        dataset="synthetic",
        store=str(tmp_path / f"w{shard}.db"),
        **settings,
    )
    return Worker(s, split=split, transport=fake.transport(), sleep=lambda _: None)


def _drive(workers: list[Worker], fake: FakeAggregator, max_steps: int = 100) -> None:
    """Interleave the workers' polls until the run is finished and every version evaluated."""
    for _ in range(max_steps):
        for w in workers:
            w.step()
        if fake.state == "finished" and all(w.evaluated_version() == fake.version for w in workers):
            return
    raise AssertionError("run did not finish")


def test_uploads_equal_cohort_step_computed_directly(tmp_path: Path, split: Split) -> None:
    fake = FakeAggregator()
    w = _worker(tmp_path, fake, split, shard=1, shards=2)
    w.register()
    other = _worker(tmp_path, fake, split, shard=0, shards=2)
    other.register()
    _start(fake, split)
    w.step()
    round_id, ids, body = fake.uploads[0]
    mine = [int(u) for u in fake.cohort if u % 2 == 1]
    assert round_id == 1 and ids == mine and mine
    cfg, hp = train_config(SEED).model(split.n_items), train_config(SEED).sam()
    users = np.asarray(mine)
    samples = [
        client_samples(split.user_train(u), split.n_items, hp.n_negatives, client_rng(SEED, 1, u))
        for u in mine
    ]
    want = cohort_step(cfg, fake.shared, users, PrivateState.fresh(cfg, SEED, users), samples, hp)
    got = decode_updates(body, cfg)
    for g, e, digest in zip(got.updates, want.uploads, got.digests, strict=True):
        assert digest == update_digest(1, e)  # bit exact
        assert g.client_id == e.client_id and g.n_samples == e.n_samples


def test_two_workers_three_rounds_match_the_simulator(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    fake, workers = _running(tmp_path, split, shards=2)
    _drive(workers, fake)

    sim, result = sim3
    for name, t in sim.shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)
    # federated evaluation: the shards' sums add up to the simulator's means
    for rec in result.rounds:
        reports = [e for e in fake.evaluations if e["model_version"] == rec.round]
        assert sorted(c for e in reports for c in e["client_ids"]) == list(range(60))
        total = {k: sum(e["sums"][k] for e in reports) for k in reports[0]["sums"]}
        total["count"] = sum(e["count"] for e in reports)
        got = means(total)
        for k, v in rec.model_test.items():  # workers report the model's own figures
            assert got[k] == pytest.approx(v, abs=1e-9), (rec.round, k)
    # the private state in the stores equals the simulator's
    for w in workers:
        state = w.store.load_states(w.users.tolist())
        for k, t in sim.store.params(w.users).items():
            torch.testing.assert_close(state.params[k], t, rtol=1e-5, atol=1e-6)


def test_crash_after_upload_before_commit_reuploads_identical_update(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    fake, workers = _running(tmp_path, split, shards=2)
    crashing = workers[0]

    real_save = crashing.store.save_states

    def crash(
        user_ids: Sequence[int],
        state: PrivateState,
        round_id: int | None,
        attempt: int | None,
        meta: Mapping[str, str | int | None] | None = None,
    ) -> None:
        if round_id is None:  # the fresh states of a new run
            return real_save(user_ids, state, round_id, attempt, meta)
        raise RuntimeError("killed before commit")

    crashing.store.save_states = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="killed"):
        crashing.step()
    assert len(fake.uploads) == 1 and fake.state == "open"
    first_digests = decode_updates(fake.uploads[0][2], fake.model_cfg()).digests
    crashing.close()

    restarted = _worker(tmp_path, fake, split, shard=0, shards=2)
    restarted.register()  # token comes from the store: no second registration
    restarted.step()
    assert len(fake.uploads) == 2
    again = decode_updates(fake.uploads[1][2], fake.model_cfg()).digests
    assert again == first_digests
    answers = [r for r in fake.requests if r.path == "/v1/rounds/1/updates"]
    assert [a.status for a in answers] == [200, 200]
    # the rest of the run is unaffected: still the simulator's model
    _drive([restarted, workers[1]], fake)
    for name, t in sim3[0].shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)


def test_restarted_worker_resumes_without_retraining(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    fake, (w,) = _running(tmp_path, split)
    w.step()  # trains round 1 (the whole cohort: the round closes)
    assert fake.version == 1
    w.close()
    w2 = _worker(tmp_path, fake, split, shard=0, shards=1)
    w2.register()
    assert sum(r.path == "/v1/clients" for r in fake.requests) == 1
    n_uploads = len(fake.uploads)
    w2.step()  # evaluates version 1, trains round 2
    w2.settle()  # the report of version 1 is delivered in the background
    assert [e["model_version"] for e in fake.evaluations] == [1]
    assert [u[0] for u in fake.uploads[n_uploads:]] == [2]
    _drive([w2], fake)
    for name, t in sim3[0].shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)


def test_small_body_budget_splits_uploads_and_changes_nothing(tmp_path: Path, split: Split) -> None:
    fake, (w,) = _running(tmp_path, split, rounds=1, max_body_bytes=4000)
    w.step()
    assert len(fake.uploads) > 1
    assert all(len(body) <= 4000 or len(ids) == 1 for _, ids, body in fake.uploads)
    assert sorted(c for _, ids, _ in fake.uploads for c in ids) == fake.cohort.tolist()
    sim = Simulator(split, train_config(SEED, rounds=1))
    sim.run()
    for name, t in sim.shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)


def test_run_loop_finishes_and_survives_an_outage(tmp_path: Path, split: Split) -> None:
    fake, (w,) = _running(tmp_path, split, retries=1, backoff_s=0.0)
    fake.failures = [503, 503, 503, 500]
    follow_rounds(w)
    assert fake.state == "finished"
    assert [e["model_version"] for e in fake.evaluations] == [1, 2, 3]
    w.close()


def test_max_rounds_stops_early(tmp_path: Path, split: Split) -> None:
    fake, (w,) = _running(tmp_path, split, rounds=5, max_rounds=2)
    follow_rounds(w)
    assert w.evaluated_version() == 2 and fake.state == "open"


def test_run_on_another_dataset_is_refused(tmp_path: Path, split: Split) -> None:
    fake = FakeAggregator()
    w = _worker(tmp_path, fake, split, shard=0, shards=1)
    w.register()
    fake.start_run(n_items=split.n_items, factor=FACTOR, layers=LAYERS, dataset="filmtrust")
    with pytest.raises(WorkerError, match="dataset"):
        w.step()


def test_store_of_another_shard_is_refused(tmp_path: Path, split: Split) -> None:
    WorkerStore(tmp_path / "w0.db").close()
    fake = FakeAggregator()
    _worker(tmp_path, fake, split, shard=0, shards=2).close()
    with pytest.raises(WorkerError, match="shards"):
        _worker(tmp_path, fake, split, shard=0, shards=3)


def test_nothing_private_leaves_the_worker(tmp_path: Path, split: Split) -> None:
    fake, workers = _running(tmp_path, split, shards=2, rounds=2)
    _drive(workers, fake)
    cfg = fake.model_cfg()
    counted: list[int] = []
    for req in fake.requests:
        assert b"user_gmf" not in req.body and b"user_mlp" not in req.body
        assert b"exp_avg" not in req.body
        if req.path.endswith("/updates"):
            decode_updates(req.body, cfg)  # strict: only item-row and tower gradients
        elif req.method == "POST" and req.path == "/v1/evaluations":
            payload = json.loads(req.body)
            assert set(payload) == {"model_version", "sums", "count", "client_ids"}
            assert all(isinstance(v, float) for v in payload["sums"].values())
        elif req.method == "POST" and req.path.endswith("/item-counts"):
            # the popularity prior's input: one sum over the worker's users, no user's items
            payload = json.loads(req.body)
            assert set(payload) == {"client_ids", "items", "counts"}
            held = [np.unique(split.user_train(u)) for u in payload["client_ids"]]
            want = np.bincount(np.concatenate(held), minlength=split.n_items)
            got = dict(zip(payload["items"], payload["counts"], strict=True))
            assert got == {i: int(c) for i, c in enumerate(want) if c}
            counted.append(len(payload["client_ids"]))
        elif req.method == "POST":
            assert req.path == "/v1/clients"
            assert set(json.loads(req.body)) == {"client_ids", "token"}  # the worker's own
        else:
            assert req.body == b""
    assert sorted(counted) == [30, 30]  # each worker once, for all its users


def test_refused_second_body_commits_only_the_accepted_users(tmp_path: Path, split: Split) -> None:
    fake, (w,) = _running(tmp_path, split, rounds=1, max_body_bytes=4000)
    uploads_seen: list[httpx.Request] = []

    def second_upload(request: httpx.Request) -> bool:
        if request.url.path.endswith("/updates"):
            uploads_seen.append(request)
            return len(uploads_seen) == 2
        return False

    fake.failures, fake.fail_when = [409], second_upload
    w.step()
    first_ids = fake.uploads[0][1]
    progress = w.store.progress(fake.cohort.tolist())
    committed = sorted(u for u, p in progress.items() if p.last_round == 1)
    assert committed == sorted(first_ids) and len(committed) < len(fake.cohort)
    n = len(fake.requests)
    w.step()  # the refused (round, attempt) is not retried
    assert not any(r.path.endswith("/updates") for r in fake.requests[n:])


def test_validation_metrics_are_reported_next_to_test_metrics(tmp_path: Path) -> None:
    vsplit = synthetic_split(n_users=30, n_items=60, seed=8, n_test_negatives=15, validation=True)
    fake, (w,) = _running(tmp_path, vsplit, rounds=1)
    _drive([w], fake)
    sim = Simulator(vsplit, train_config(SEED, rounds=1))
    rec = sim.run().rounds[0]
    (report,) = fake.evaluations
    got = means({**report["sums"], "count": report["count"]})
    for k, v in rec.model_test.items():  # workers report the model's own figures
        assert got[k] == pytest.approx(v, abs=1e-9)
    for k, v in rec.model_val.items():
        assert got[f"val/{k}"] == pytest.approx(v, abs=1e-9)


def test_a_finished_run_the_worker_never_joined_is_ignored(tmp_path: Path, split: Split) -> None:
    fake = FakeAggregator(run_id=1)
    w = _worker(tmp_path, fake, split, shard=0, shards=1)
    w.register()
    fake.start_run(n_items=split.n_items + 1, dataset="other")  # would be refused if adopted
    fake.state = "finished"
    assert w.step() is False and not w.finished()
    fake.run_id = 2
    _start(fake, split, rounds=1)
    assert w.step() is True and fake.version == 1


def test_crash_after_the_upload_that_closed_the_round_is_recovered(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    fake, (w,) = _running(tmp_path, split)
    real_save = w.store.save_states

    def crash(
        user_ids: Sequence[int],
        state: PrivateState,
        round_id: int | None,
        attempt: int | None,
        meta: Mapping[str, str | int | None] | None = None,
    ) -> None:
        if round_id is None:
            return real_save(user_ids, state, round_id, attempt, meta)
        raise RuntimeError("killed before commit")

    w.store.save_states = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="killed"):
        w.step()
    assert fake.version == 1 and fake.round_id == 2  # the upload closed round 1
    w.close()

    restarted = _worker(tmp_path, fake, split, shard=0, shards=1)
    restarted.register()
    restarted.step()  # recovers round 1 (answered "duplicate"), then trains round 2
    first_retry = [r for r in fake.requests if r.path == "/v1/rounds/1/updates"]
    assert [r.status for r in first_retry] == [200, 200]
    assert restarted.store.get_meta("pending_upload") is None
    _drive([restarted], fake)
    # no user missed its private step: the run is still exactly the simulator's
    for name, t in sim3[0].shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)
    got = restarted.store.load_states(list(range(split.n_users))).params
    want = sim3[0].store.params(np.arange(split.n_users))
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_the_upload_that_closes_a_round_answers_the_next_one_without_a_poll(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    """A lone worker closes every round with its upload: it polls once, at the start, and
    takes each next round (and the end of the run) from its last upload's answer."""
    fake, (w,) = _running(tmp_path, split)
    _drive([w], fake)
    polls = [r for r in fake.requests if r.path == "/v1/rounds/current"]
    assert len(polls) == 1
    assert [u[0] for u in fake.uploads] == [1, 2, 3]
    assert [e["model_version"] for e in fake.evaluations] == [1, 2, 3]
    for name, t in sim3[0].shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)


def test_item_counts_are_reported_once_a_run_through_a_restart(
    tmp_path: Path, split: Split
) -> None:
    """A worker reports its users' item counts at the first step of a run and never again in
    that run, not even once restarted (the store keeps which run it reported)."""
    fake, (w,) = _running(tmp_path, split, rounds=2)
    w.step()
    w.step()
    w.close()
    restarted = _worker(tmp_path, fake, split, shard=0, shards=1)
    restarted.register()
    _drive([restarted], fake)
    posts = [r for r in fake.requests if r.path.endswith("/item-counts")]
    assert [r.path for r in posts] == ["/v1/runs/1/item-counts"]


def test_in_a_dp_run_with_a_prior_share_each_user_counts_at_most_k_items(
    tmp_path: Path, split: Split
) -> None:
    """The counts a worker reports under DP are the simulator's draw: each owned user at most
    ``dp_prior_items`` of its distinct training items (fedrecgel.prior.user_draw)."""
    _, (w,) = _running(tmp_path, split, rounds=1)
    base: dict[str, Any] = {"n_items": split.n_items, "seed": 4}
    dp = RunConfig(**base, target_epsilon=3.0, dp_prior_share=0.5, dp_prior_items=2)
    users = [int(u) for u in w.data.user_ids]
    held = [split.user_train(u) for u in users]
    got = w.evaluation.prior.counts(dp)
    assert np.array_equal(got, bounded_counts(held, users, 2, 4, split.n_items))
    assert got.sum() == sum(min(2, len(np.unique(h))) for h in held)
    plain = w.evaluation.prior.counts(RunConfig(**base))
    assert plain.sum() == sum(len(np.unique(h)) for h in held) > got.sum()


def test_a_sparse_secure_run_takes_no_count_report(tmp_path: Path, split: Split) -> None:
    """Its prior comes from the counts its rounds unmask (fedrecgel.prior.RoundPrior)."""
    fake, (w,) = _running(tmp_path, split, rounds=1)
    cfg = RunConfig(n_items=split.n_items, secure_aggregation="sparse", negative_pool=16)
    w.evaluation.prior.report(7, cfg)
    assert not [r for r in fake.requests if r.path.endswith("/item-counts")]
    w.evaluation.prior.report(7, RunConfig(n_items=split.n_items))  # a plain run's: sent
    assert [r.path for r in fake.requests if r.path.endswith("/item-counts")]


def test_a_scored_version_is_kept_through_a_crash_and_delivered_after_it(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    """Version 1 is scored while round 2's upload is in flight and kept in the store with
    round 2's states (one transaction); a worker that dies before delivering the report delivers
    it once restarted (the same sums, scored with the states after round 1)."""
    fake, (w,) = _running(tmp_path, split)
    fake.fail_when = lambda req: req.url.path == "/v1/evaluations"
    fake.failures = [503] * 100  # every delivery fails (retries included): the report stays kept
    w.step()
    with contextlib.suppress(AggregatorCallError):  # when the step delivers too, it fails
        w.step()
    w.settle()
    assert w.evaluation.done() == 1 and w.evaluated_version() == 0
    w.close()
    fake.failures = []
    restarted = _worker(tmp_path, fake, split, shard=0, shards=1)
    restarted.register()
    _drive([restarted], fake)
    assert [e["model_version"] for e in fake.evaluations] == [1, 2, 3]
    rec = sim3[1].rounds[0]
    got = means({**fake.evaluations[0]["sums"], "count": fake.evaluations[0]["count"]})
    for k, v in rec.model_test.items():
        assert got[k] == pytest.approx(v, abs=1e-9)


def test_a_round_commits_states_scores_and_note_in_one_transaction(
    tmp_path: Path, split: Split
) -> None:
    """Each store commit is an fsync: a trained round writes its upload note, then the new
    states with the scores kept and the note cleared in one transaction (and the delivered
    report's removal), not a transaction for each."""
    from sqlalchemy import event

    fake, (w,) = _running(tmp_path, split)
    w.step()  # round 1 (version 0 scored beside its upload)
    w.settle()
    commits: list[int] = []
    event.listen(w.store.engine, "commit", lambda _conn: commits.append(1))
    w.step()  # round 2: version 1 scored beside the upload, kept with the states
    w.settle()
    assert fake.uploads[-1][0] == 2 and w.evaluated_version() == 1
    assert w.store.get_meta("pending_upload") is None
    assert len(commits) == 3, len(commits)  # note, states + scores + note cleared, delivery


def test_a_report_waits_for_the_end_of_the_round_its_upload_left_open(
    tmp_path: Path, split: Split, sim3: tuple[Simulator, RunResult]
) -> None:
    """A report posted while the aggregator takes the other workers' uploads and closes the
    round slows that close: the worker whose upload left the round open delivers it once
    the round is over; the one whose upload closed it delivers at once."""
    fake, (w0, w1) = _running(tmp_path, split, shards=2)
    w0.step()  # round 1: left open
    assert w0.left_open
    w1.step()  # closes round 1
    assert not w1.left_open
    w0.step()  # round 2, version 1 scored beside the upload: kept, not delivered
    w0.settle()
    assert w0.left_open and w0.evaluation.done() == 1 and fake.evaluations == []
    w1.step()  # closes round 2, delivers its report of version 1 at once
    w1.settle()
    assert [e["count"] for e in fake.evaluations] == [len(w1.evaluation.users)]
    w0.step()  # sees round 3: round 2 is over, so its report goes out
    w0.settle()
    assert sorted(e["count"] for e in fake.evaluations) == sorted(
        [len(w0.evaluation.users), len(w1.evaluation.users)]
    )
    _drive([w0, w1], fake)
    assert sorted(e["model_version"] for e in fake.evaluations) == [1, 1, 2, 2, 3, 3]
    for name, t in sim3[0].shared.items():
        torch.testing.assert_close(fake.shared[name], t, rtol=1e-5, atol=1e-6)
