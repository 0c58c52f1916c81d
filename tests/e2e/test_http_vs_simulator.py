"""End-to-end over HTTP with real processes on loopback.

The aggregator (``python -m services.aggregator``) and the client workers
(``python -m services.client_sim``) run as subprocesses on free ports, started through the
launcher's helpers (:mod:`services.launcher`, what ``fedrec up`` uses), with a real
redis-server and SQLite, and again with PostgreSQL. The federated run over HTTP must compute
what the in-process :class:`~fedrecgel.simulate.Simulator` computes (Architecture invariant 5),
also when the aggregator or a worker is SIGKILLed mid-run (invariant 3), and no body on the
wire may carry a user's private state or interactions (invariant 1).

The simulator reference is computed once per session: a 20-round run, snapshotted after
:data:`SHORT` rounds for the shorter crash and privacy runs (the first rounds of a run do not
depend on its length).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from torch import Tensor

from fedrecgel.data import Split, load_split
from fedrecgel.simulate import RoundRecord, Simulator, TrainConfig
from fedrecgel.wire import decode_model
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.client_sim.worker import Worker
from services.launcher import Cluster, UpOptions, cluster, run_config, worker_torch_threads
from tests.support.loopback import free_port

pytestmark = pytest.mark.slow

DATASET = "filmtrust"
ROUNDS = 20  # the full run (cases 1 and 2)
SHORT = 6  # crash and privacy runs
TOL = 1e-5  # on parameters and metrics
# shards=2: the simulator batches each round as the two workers do (see TrainConfig.shards)
TRAIN = TrainConfig(rounds=ROUNDS, shards=2)  # the default settings
RUN_TIMEOUT_S = 400.0


# ----------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Reference:
    """The in-process simulator's run: per-round records and the shared parameters after
    round ``r`` for each ``r`` in ``params``."""

    records: list[RoundRecord]
    params: dict[int, dict[str, Tensor]]
    wall_seconds: float


@pytest.fixture(scope="session")
def split() -> Split:
    """The FilmTrust split shipped with the package (no validation hold-out)."""
    return load_split(DATASET)


@pytest.fixture(scope="session")
def reference(split: Split) -> Reference:
    """The simulator's 20-round run, computed once per session (snapshot after SHORT rounds).

    It runs with the torch thread count the workers get (kernels, and so float rounding,
    depend on it), whatever earlier tests in this process set.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(TRAIN.shards))
    sim = Simulator(split, TRAIN)
    snaps: dict[int, dict[str, Tensor]] = {}

    def snap(rec: RoundRecord) -> None:
        if rec.round == SHORT:
            snaps[SHORT] = {k: v.clone() for k, v in sim.shared.items()}

    try:
        result = sim.run(on_round=snap)
    finally:
        torch.set_num_threads(before)
    snaps[ROUNDS] = {k: v.clone() for k, v in sim.shared.items()}
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
        got = row["metrics"] or {}
        missing = set(rec.test) - set(got)
        if missing:
            problems.append(f"round {rec.round}: metrics {sorted(missing)} missing")
        for k, v in rec.test.items():
            if k in got:
                agree.metrics = max(agree.metrics, abs(float(got[k]) - v))
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
) -> Iterator[Cluster]:
    """A started aggregator process (no workers yet); everything is stopped at the end."""
    opts = UpOptions(
        # the simulator's run over HTTP; a round must never hit its deadline on a slow CI
        # machine (a retried round draws another cohort, which the simulator does not)
        run=TRAIN.run_params(dataset=DATASET, rounds=rounds, deadline_s=3600.0),
        workers=2,
        aggregator_port=free_port(),
        workdir=workdir,
        redis_url=redis_url,
        database_url=database_url,
        recommend=False,
        worker_poll_max_s=0.5,
        startup_timeout_s=300.0,
        worker_log_level="INFO",
    )
    workdir.mkdir(parents=True, exist_ok=True)
    with cluster(opts) as c:
        c.start_aggregator()
        yield c


def start_training(c: Cluster, split: Split) -> None:
    """Start the workers, wait for their registrations, start the run."""
    for i in range(c.opts.workers):
        c.start_worker(i)
    c.wait_registered(split.n_users)
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


# ----------------------------------------------------------------------------- cases 1, 2


def test_http_run_with_redis_and_sqlite_matches_simulator(
    tmp_path: Path, redis_url: str, split: Split, reference: Reference
) -> None:
    """20 FilmTrust rounds: aggregator + 2 workers over HTTP, Redis events, SQLite."""
    with services(tmp_path, ROUNDS, redis_url=redis_url) as c:
        health = httpx.get(f"{c.agg_url}/healthz", timeout=10).json()
        assert health["redis"] == "ok", health
        start_training(c, split)
        history, model = finish(c)
    assert_matches(history, model, reference, ROUNDS)


def test_http_run_with_postgres_matches_simulator(
    tmp_path: Path, postgres_url: str, split: Split, reference: Reference
) -> None:
    """The same 20-round run with the aggregator on PostgreSQL (no Redis)."""
    with services(tmp_path, ROUNDS, database_url=postgres_url) as c:
        health = httpx.get(f"{c.agg_url}/healthz", timeout=10).json()
        assert health["database"] == "ok", health
        start_training(c, split)
        history, model = finish(c)
    assert_matches(history, model, reference, ROUNDS)


# ----------------------------------------------------------------------------- case 3


def test_aggregator_sigkill_mid_round_changes_nothing(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    """SIGKILL the aggregator while a round holds some but not all updates, restart it on the
    same database and port: the workers ride it out and the run ends with the simulator's
    model."""
    with services(tmp_path, SHORT) as c:
        start_training(c, split)
        wait_closed(c, 1)
        slow = c.latest("worker-1")
        slow.send(signal.SIGSTOP)  # the open round now waits for worker-1's update
        try:
            before = wait_partial_round(c, after_round=1)
            agg = c.latest("aggregator")
            assert agg.kill() == -signal.SIGKILL
            c.start_aggregator()
            after = round_status(c, before["round_id"])
        finally:
            slow.send(signal.SIGCONT)
        # every acknowledged update survived the crash, the round is still open
        assert after["state"] == "open", after
        assert after["attempt"] == before["attempt"], (before, after)
        assert after["updates_received"] >= before["updates_received"], (before, after)
        history, model = finish(c)
        print(f"aggregator killed in round {before['round_id']} with {before['updates_received']}")
    assert_matches(history, model, reference, SHORT)


# ----------------------------------------------------------------------------- case 4


def test_worker_sigkill_mid_run_changes_nothing(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    """SIGKILL a worker mid-run (its part of the open round missing), restart it on the same
    store: the run completes with the simulator's model."""
    with services(tmp_path, SHORT) as c:
        start_training(c, split)
        wait_closed(c, 1)
        victim = c.latest("worker-1")
        victim.send(signal.SIGSTOP)
        try:
            st = wait_partial_round(c, after_round=1)
        finally:
            code = victim.kill()  # SIGKILL also ends a stopped process
        assert code == -signal.SIGKILL
        c.start_worker(1)
        history, model = finish(c)
        print(f"worker-1 killed in round {st['round_id']} at {st['updates_received']} updates")
    assert_matches(history, model, reference, SHORT)


# ----------------------------------------------------------------------------- case 5


@dataclass(frozen=True)
class Exchange:
    """One recorded HTTP exchange: the request and the response, bodies as sent."""

    method: str
    path: str
    request_type: str
    request_body: bytes
    status: int
    response_type: str
    response_body: bytes

    def bodies(self) -> list[tuple[str, str, bytes]]:
        """(direction, content type, body) of the non-empty bodies."""
        out = []
        if self.request_body:
            out.append(("request", self.request_type, self.request_body))
        if self.response_body:
            out.append(("response", self.response_type, self.response_body))
        return out


class RecordingTransport(httpx.HTTPTransport):
    """A real HTTP transport that keeps every request and response body it carries."""

    def __init__(self) -> None:
        super().__init__()
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and record both bodies."""
        request_body = request.read()
        response = super().handle_request(request)
        # the aggregator uses no content-encoding: these are the bytes of the wire
        response_body = response.read()
        response.close()
        with self._lock:
            self.exchanges.append(
                Exchange(
                    request.method,
                    request.url.path,
                    request.headers.get("content-type", ""),
                    request_body,
                    response.status_code,
                    response.headers.get("content-type", ""),
                    response_body,
                )
            )
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=response_body,
            extensions=response.extensions,
        )


SHARED_TENSOR = re.compile(
    r"^(\d+/)?(item_gmf|item_mlp)(\.rows|\.values)?$|^(\d+/)?(tower\.\d+|predict)\.(weight|bias)$"
)
MODEL_META = {"format", "version", "kind", "n_items", "factor", "layers"}
UPDATES_META = {"format", "round", "updates"}
UPDATE_ENTRY = {"client_id", "n_samples", "loss"}
METRIC = r"(val/)?(hr|ndcg)@\d+"
RUN_CONFIG = (
    "n_items|kind|factor|layers|rounds|fraction|seed|optimizer|server_lr|weighting|clip|"
    "rho_sh|rho_ns|client_lr|n_negatives|chunk_size|deadline_s|quorum|dataset"
)
ERROR_KEYS = {"error", "detail"}
# (method, path regex) -> (request key paths, response key paths), regexes over dotted paths
# (list elements as ``[]``); from docs/API.md
API_KEYS: list[tuple[str, str, str, str]] = [
    ("POST", r"/v1/clients", r"client_ids", r"token|client_ids"),
    ("GET", r"/v1/clients/count", r"", r"registered"),
    (
        "GET",
        r"/v1/rounds/current",
        r"",
        rf"run_id|round_id|attempt|state|deadline|model_version|cohort|cohort_size|config"
        rf"|config\.({RUN_CONFIG})",
    ),
    ("POST", r"/v1/rounds/\d+/updates", r"", r"results|results\[\]\.(client_id|status)"),
    (
        "POST",
        r"/v1/evaluations",
        rf"model_version|sums|sums\.{METRIC}|count|client_ids",
        r"model_version|accepted|ignored|complete",
    ),
    (
        "POST",
        r"/v1/runs",
        rf"{RUN_CONFIG}",
        rf"run_id|state|round_id|model_version|cohort_size|config|config\.({RUN_CONFIG})",
    ),
    (
        "GET",
        r"/v1/runs/current/history",
        r"",
        rf"run_id|rounds|rounds\[\]\.(round_id|model_version|n_updates|loss|metrics|closed_at"
        rf"|seconds)|rounds\[\]\.metrics\.{METRIC}",
    ),
]


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key of a JSON value as a dotted path (list elements as ``[]``)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(obj, list):
        for v in obj:
            out |= key_paths(v, f"{prefix}[]")
    return out


def safetensors_header(body: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors blob."""
    n = int.from_bytes(body[:8], "little")
    header: dict[str, Any] = json.loads(body[8 : 8 + n])
    return header


def check_safetensors(ex: Exchange, direction: str, body: bytes) -> list[str]:
    """Problems of a safetensors body: tensor names and metadata beyond the shared model."""
    header = safetensors_header(body)
    meta = header.pop("__metadata__", {}) or {}
    problems = [
        f"{ex.method} {ex.path} {direction}: tensor {name!r}"
        for name in header
        if not SHARED_TENSOR.match(name)
    ]
    if meta.get("format") == "fedrecgel-updates":
        if set(meta) != UPDATES_META:
            problems.append(f"{ex.path}: upload metadata {sorted(meta)}")
        for entry in json.loads(meta.get("updates", "[]")):
            if set(entry) != UPDATE_ENTRY:
                problems.append(f"{ex.path}: update entry {sorted(entry)}")
    elif meta.get("format") == "fedrecgel-model":
        if set(meta) != MODEL_META:
            problems.append(f"{ex.path}: model metadata {sorted(meta)}")
    else:
        problems.append(f"{ex.method} {ex.path} {direction}: unknown blob format {meta!r}")
    return problems


def check_json(ex: Exchange, direction: str, body: bytes) -> list[str]:
    """Problems of a JSON body: keys the API does not define for this endpoint."""
    keys = key_paths(json.loads(body))
    if direction == "response" and ex.status >= 400:
        extra = keys - ERROR_KEYS
        return [f"{ex.method} {ex.path} error body keys {sorted(extra)}"] if extra else []
    for method, path, req, resp in API_KEYS:
        if ex.method == method and re.fullmatch(path, ex.path):
            allowed = re.compile(req if direction == "request" else resp)
            extra = {k for k in keys if not allowed.fullmatch(k)}
            return [f"{ex.method} {ex.path} {direction}: keys {sorted(extra)}"] if extra else []
    return [f"{ex.method} {ex.path} {direction}: JSON on an endpoint the run should not use"]


def private_vectors(stores: list[WorkerStore]) -> list[bytes]:
    """The float32 bytes of every user's private vectors and Adam moments (rows that carry
    information: a vector of a few distinct values, e.g. the zero moments of a user never
    trained, is skipped)."""
    out: list[bytes] = []
    for store in stores:
        state = store.load_states(store.user_ids().tolist())
        for group in (state.params, state.exp_avg, state.exp_avg_sq):
            for t in group.values():
                rows = t.to(torch.float32).contiguous().numpy()
                for row in rows:
                    if len(np.unique(row)) > len(row) // 2:
                        out.append(row.tobytes())
    return out


def find_needles(haystack: bytes, needles: list[bytes]) -> list[int]:
    """Indices of ``needles`` (each a multiple of 4 bytes long) that occur in ``haystack``
    at any byte offset."""
    if not needles:
        return []
    heads = np.frombuffer(b"".join(n[:4] for n in needles), dtype="<u4")
    order = np.argsort(heads, kind="stable")
    keys = heads[order]
    found: set[int] = set()
    for align in range(4):
        count = (len(haystack) - align) // 4
        if count <= 0:
            continue
        words = np.frombuffer(haystack, dtype="<u4", offset=align, count=count)
        pos = np.searchsorted(keys, words)
        pos[pos == len(keys)] = 0
        for w in np.flatnonzero(keys[pos] == words):
            start = align + 4 * int(w)
            j = int(np.searchsorted(keys, words[w]))
            while j < len(keys) and keys[j] == words[w]:
                idx = int(order[j])
                if haystack[start : start + len(needles[idx])] == needles[idx]:
                    found.add(idx)
                j += 1
    return sorted(found)


def interaction_problems(split: Split, exchanges: list[Exchange]) -> list[str]:
    """Bodies that carry a user's training-item list.

    JSON bodies (and the JSON headers of safetensors bodies) must not contain any user's list
    as JSON text. Integer tensors only occur as the row indices of item-table gradients; each
    is the union of the client's positives and its sampled negatives, so none may equal a
    user's item set (users with fewer than 3 distinct items are not telling and are skipped).
    """
    lists: dict[frozenset[int], int] = {}
    texts: list[tuple[int, bytes]] = []
    for u in range(split.n_users):
        items = [int(i) for i in split.user_train(u)]
        if len(set(items)) < 3:
            continue
        lists[frozenset(items)] = u
        texts.append((u, json.dumps(items).encode()))
        texts.append((u, json.dumps(items, separators=(",", ":")).encode()))
    problems: list[str] = []
    n_rows = 0
    for ex in exchanges:
        for direction, ctype, body in ex.bodies():
            where = f"{ex.method} {ex.path} {direction}"
            text = body
            if ctype.startswith("application/octet-stream"):
                text = body[: 8 + int.from_bytes(body[:8], "little")]
                for name, t in st_load(body).items():
                    if t.dtype in (torch.int64, torch.int32):
                        n_rows += 1
                        user = lists.get(frozenset(int(i) for i in t.tolist()))
                        if user is not None:
                            problems.append(f"{where}: {name} is the item set of user {user}")
            problems += [f"{where}: items of user {u} as JSON" for u, f in texts if f in text]
    if n_rows == 0:
        problems.append("no row-index tensor was seen: nothing was checked")
    return problems


def test_no_private_state_or_interactions_on_the_wire(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    """Record every body of a run (workers in-process behind a recording transport, the real
    aggregator process) and look for anything private in it."""
    recorder = RecordingTransport()
    with services(tmp_path, SHORT) as c:
        workers = [
            Worker(
                WorkerSettings(
                    aggregator=c.agg_url,
                    shard=i,
                    shards=2,
                    enrolment_token=c.enrolment_token(i),
                    dataset=DATASET,
                    store=str(c.worker_store(i)),
                ),
                split=split,
                transport=recorder,
            )
            for i in range(2)
        ]
        operator = httpx.Client(base_url=c.agg_url, transport=recorder, timeout=30)
        threads = torch.get_num_threads()
        torch.set_num_threads(worker_torch_threads(2))  # as the worker processes run
        try:
            for w in workers:
                w.register()
            resp = operator.post(
                "/v1/runs", json=run_config(c.opts, split.n_items), headers=c.operator_headers()
            )
            assert resp.status_code == 201, resp.text
            mid_needles: list[bytes] = []
            for _ in range(20 * SHORT):
                for w in workers:
                    w.step()
                history = operator.get("/v1/runs/current/history").json()
                if not mid_needles and len(history["rounds"]) >= SHORT // 2:
                    mid_needles = private_vectors([w.store for w in workers])
                if all(w.finished() for w in workers):
                    break
            assert all(w.finished() for w in workers), "the in-process workers did not finish"
            model = operator.get("/v1/models/latest", headers=c.operator_headers()).content
            history = operator.get("/v1/runs/current/history").json()
            end_needles = private_vectors([w.store for w in workers])
        finally:
            torch.set_num_threads(threads)
            operator.close()
            for w in workers:
                w.close()
    exchanges = recorder.exchanges
    assert {ex.path for ex in exchanges} >= {"/v1/clients", "/v1/rounds/current", "/v1/evaluations"}
    assert any(ex.path.endswith("/updates") for ex in exchanges)
    problems: list[str] = []
    n_blobs = 0
    for ex in exchanges:
        for direction, ctype, body in ex.bodies():
            if "json" in ctype:
                problems += check_json(ex, direction, body)
            elif ctype.startswith("application/octet-stream"):
                n_blobs += 1
                problems += check_safetensors(ex, direction, body)
            else:
                problems.append(f"{ex.method} {ex.path} {direction}: content type {ctype!r}")
    assert n_blobs > 0
    assert not problems, problems[:20]

    # (b) no private vector or Adam moment, mid-run or final, in any body
    needles = sorted(set(mid_needles) | set(end_needles))
    assert len(mid_needles) > split.n_users and len(end_needles) > len(mid_needles) // 2
    for ex in exchanges:
        for direction, _, body in ex.bodies():
            hits = find_needles(body, needles)
            assert not hits, (
                f"{ex.method} {ex.path} {direction} carries {len(hits)} private vectors"
            )

    # (d) no training-item list
    problems = interaction_problems(split, exchanges)
    assert not problems, problems[:20]

    # and the recorded run computed what the simulator computes
    assert_matches(history, model, reference, SHORT)
