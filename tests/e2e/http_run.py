"""The federated run over HTTP against the in-process simulator: the reference run, how far an
HTTP run is from it, and the processes of a run (aggregator, workers) with what the tests wait
for. The tests are in ``test_http_vs_simulator.py`` and ``test_wire_privacy.py``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.simulate import RoundRecord, Simulator, TrainConfig
from fedrecgel.wire import decode_model
from harness.parity import aggregator_started, parity_options, served_and_model, start_workers
from services.launcher import Cluster, worker_torch_threads

DATASET = "filmtrust"
ROUNDS = 20  # the full run (cases 1 and 2)
SHORT = 6  # crash and privacy runs
TOL = 1e-5  # on parameters and metrics
# shards=2: the simulator batches each round as the two workers do (see TrainConfig.shards)
# per-client uploads aggregated as the aggregator does (not summed inside the backward)
TRAIN = TrainConfig(rounds=ROUNDS, shards=2, per_client_uploads=True)  # the default settings
#: the same run with one partial sum per worker and round (``upload_grouping=worker``)
PARTIAL = TrainConfig(rounds=SHORT, shards=2, upload_grouping="worker")
RUN_TIMEOUT_S = 400.0


# ----------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Reference:
    """The in-process simulator's run: per-round records and the shared parameters after
    round ``r`` for each ``r`` in ``params``."""

    records: list[RoundRecord]
    params: dict[int, dict[str, Tensor]]
    wall_seconds: float


def simulate_reference(split: Split, train: TrainConfig = TRAIN) -> Reference:
    """The simulator's run of ``train`` (20 rounds; snapshot after SHORT rounds).

    It runs with the torch thread count the workers get (kernels, and so float rounding,
    depend on it), whatever earlier tests in this process set.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(train.shards))
    sim = Simulator(split, train)
    snaps: dict[int, dict[str, Tensor]] = {}

    def snap(rec: RoundRecord) -> None:
        if rec.round == SHORT:
            snaps[SHORT] = {k: v.clone() for k, v in sim.shared.items()}

    try:
        result = sim.run(on_round=snap)
    finally:
        torch.set_num_threads(before)
    snaps[train.rounds] = {k: v.clone() for k, v in sim.shared.items()}
    return Reference(result.rounds, snaps, result.wall_seconds)


# ----------------------------------------------------------------------------- comparison


@dataclass
class Agreement:
    """How far an HTTP run is from the reference: max abs differences."""

    params: dict[str, float] = field(default_factory=dict)
    metrics: float = 0.0
    loss: float = 0.0

    @property
    def max_param(self) -> float:
        """The largest parameter difference over all tensors."""
        return max(self.params.values(), default=0.0)


def _metrics_apart(rec: RoundRecord, got: dict[str, Any], problems: list[str]) -> float:
    """How far a round's published metrics are from the simulator's (problems: what is
    missing or chosen otherwise)."""
    want = served_and_model(rec)
    missing = set(want) - set(got)
    if missing:
        problems.append(f"round {rec.round}: metrics {sorted(missing)} missing")
    if got.get("prior_weight") != rec.prior_weight:
        problems.append(
            f"round {rec.round}: prior weight {got.get('prior_weight')}, want {rec.prior_weight}"
        )
    return max((abs(float(got[k]) - v) for k, v in want.items() if k in got), default=0.0)


def compare(
    history: dict[str, Any], model: bytes, ref: Reference, rounds: int
) -> tuple[Agreement, list[str]]:
    """Differences between an HTTP run (history and final model blob) and the reference;
    with the problems found (empty when the run agrees within :data:`TOL`)."""
    problems: list[str] = []
    agree = Agreement()
    rows = history["rounds"]
    if [r["round_id"] for r in rows] != list(range(1, rounds + 1)):
        problems.append(f"round ids {[r['round_id'] for r in rows]}")
    if [r["model_version"] for r in rows] != list(range(1, rounds + 1)):
        problems.append(f"model versions {[r['model_version'] for r in rows]}")
    for rec, row in zip(ref.records[:rounds], rows, strict=False):
        if row["n_updates"] != rec.n_clients:
            problems.append(f"round {rec.round}: {row['n_updates']} updates, want {rec.n_clients}")
        agree.loss = max(agree.loss, abs(float(row["loss"]) - rec.loss))
        agree.metrics = max(agree.metrics, _metrics_apart(rec, row["metrics"] or {}, problems))
    _, shared, version = decode_model(model)
    if version != rounds:
        problems.append(f"final model version {version}, want {rounds}")
    want = ref.params[rounds]
    if set(shared) != set(want):
        problems.append(f"tensor names {sorted(shared)} != {sorted(want)}")
    for name, t in want.items():
        if name in shared:
            agree.params[name] = float((shared[name] - t).abs().max())
    if agree.max_param > TOL:
        worst = max(agree.params, key=lambda k: agree.params[k])
        problems.append(f"params differ by up to {agree.max_param:.3g} (worst: {worst})")
    if agree.metrics > TOL:
        problems.append(f"metrics differ by up to {agree.metrics:.3g}")
    if agree.loss > TOL:
        problems.append(f"round losses differ by up to {agree.loss:.3g}")
    return agree, problems


def assert_matches(history: dict[str, Any], model: bytes, ref: Reference, rounds: int) -> None:
    """The HTTP run equals the simulator's run of the same length, within :data:`TOL`."""
    agree, problems = compare(history, model, ref, rounds)
    print(
        f"agreement over {rounds} rounds: params {agree.max_param:.3g}, "
        f"metrics {agree.metrics:.3g}, loss {agree.loss:.3g}"
    )
    assert not problems, "; ".join(problems)


# ----------------------------------------------------------------------------- processes


@contextlib.contextmanager
def services(
    workdir: Path,
    rounds: int,
    *,
    redis_url: str | None = None,
    database_url: str | None = None,
    train: TrainConfig = TRAIN,
) -> Iterator[Cluster]:
    """A started aggregator process (no workers yet) for the run of ``train``; everything is
    stopped at the end."""
    opts = parity_options(
        train,
        DATASET,
        workdir,
        rounds=rounds,
        workers=2,
        redis_url=redis_url,
        database_url=database_url,
        worker_poll_max_s=0.5,
        worker_log_level="INFO",
    )
    with aggregator_started(opts) as c:
        yield c


def start_training(c: Cluster, split: Split) -> None:
    """Start the workers, wait for their registrations, start the run."""
    start_workers(c, split.n_users)
    c.start_run(split.n_items)


def latest_model(c: Cluster) -> bytes:
    """``GET /v1/models/latest`` (operator token)."""
    resp = httpx.get(f"{c.agg_url}/v1/models/latest", headers=c.operator_headers(), timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.content


def finish(c: Cluster) -> tuple[dict[str, Any], bytes]:
    """Wait for the run to complete and the workers to exit cleanly; history and model."""
    c.wait_complete(RUN_TIMEOUT_S)
    for i in range(c.opts.workers):
        proc = c.latest(f"worker-{i}")
        try:
            code = proc.popen.wait(timeout=60)
        except Exception:
            pytest.fail(f"worker-{i} did not exit after the run:\n{proc.log_tail()}")
        assert code == 0, f"worker-{i} exited with {code}:\n{proc.log_tail()}"
    return c.history(), latest_model(c)


def round_status(c: Cluster, round_id: int) -> dict[str, Any]:
    """``GET /v1/rounds/{round_id}``."""
    resp = httpx.get(f"{c.agg_url}/v1/rounds/{round_id}", timeout=10)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def current_round_id(c: Cluster) -> int | None:
    """The id of the run's current round (operator view)."""
    resp = httpx.get(f"{c.agg_url}/v1/rounds/current", headers=c.operator_headers(), timeout=10)
    resp.raise_for_status()
    rid = resp.json().get("round_id")
    return None if rid is None else int(rid)


def wait_partial_round(c: Cluster, after_round: int, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until a round > ``after_round`` is open with some but not all updates received.

    The caller has stopped (SIGSTOP) one worker, so the open round cannot complete and the
    other worker's upload leaves it partial.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c.check_alive()
        c.check_workers()
        rid = current_round_id(c)
        if rid is not None and rid > after_round:
            st = round_status(c, rid)
            if st["state"] == "open" and 0 < st["updates_received"] < st["cohort_size"]:
                return st
        time.sleep(0.05)
    raise AssertionError(f"no partially received round after round {after_round} in time")


def wait_closed(c: Cluster, n_rounds: int, timeout_s: float = 300.0) -> None:
    """Wait until at least ``n_rounds`` rounds are closed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c.check_alive()
        c.check_workers()
        if len(c.history()["rounds"]) >= n_rounds:
            return
        time.sleep(0.1)
    raise AssertionError(f"{n_rounds} rounds did not close in time")
