"""A client-simulation worker: many users of one shard, trained round by round.

The worker owns the users ``u % shards == shard`` of a split. Each poll (:meth:`Worker.step`):

1. read the current round; on a run not seen before, check its dataset and catalogue, and give
   every owned user a fresh private state (keyed by (seed, user), as the simulator does);
2. evaluate every model version it has not evaluated yet over ALL its users, with their private
   state as it is now (a version v is evaluated before the worker trains round v + 1, so that is
   the state after round v), and report metric sums (federated evaluation);
3. if the round is open and some owned users are in its cohort and have not committed this
   (round, attempt): download that round's model, draw their samples from
   ``client_rng(seed, round, user)``, run :func:`fedrecgel.sam.cohort_step` for them together,
   upload, and only after the 2xx commit their new private state (one transaction).

A crash between the upload and the commit leaves the old state in the store, so the restarted
worker recomputes the same update for the same users, which the server answers as a duplicate.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import numpy as np
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fedrecgel.data import Split, load_split
from fedrecgel.metrics import KS, metric_sums
from fedrecgel.model import Scorer
from fedrecgel.sam import PrivateState, StepResult, client_rng, client_samples, cohort_step
from services.client_sim.api import (
    AggregatorClient,
    AggregatorError,
    RetryPolicy,
    RoundInfo,
    RunConfig,
)
from services.client_sim.store import WorkerStore, model_key

log = logging.getLogger(__name__)

VERSIONS_CHANNEL = "fedrec:versions"
_ORDINAL = re.compile(r"-(\d+)$")


def hostname_ordinal(hostname: str) -> int:
    """The trailing ordinal of a host name (``fedrec-worker-2`` -> 2; a FQDN's first label).

    A StatefulSet's pod ``<name>-<ordinal>`` gets that host name, so each replica owns a
    stable shard across restarts and rescheduling.
    """
    label = hostname.split(".", 1)[0]
    match = _ORDINAL.search(label)
    if match is None:
        raise ValueError(f"host name {hostname!r} does not end in -<ordinal>")
    return int(match.group(1))


class WorkerSettings(BaseSettings):
    """Worker configuration; every field can be set from the env as ``FEDREC_WORKER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_WORKER_", extra="ignore")

    aggregator: str = "http://127.0.0.1:8700"
    shard: int = 0
    shards: int = 1
    dataset: str = "filmtrust"
    data_dir: Path | None = None
    validation: bool = False
    store: str = "worker-0.db"
    redis_url: str | None = None
    max_rounds: int | None = None
    exit_when_finished: bool = True
    poll_min_s: float = 0.2
    poll_max_s: float = 5.0
    timeout_s: float = 30.0
    retries: int = 4
    backoff_s: float = 0.2
    max_body_bytes: int = 8 * 1024 * 1024
    log_level: str = "INFO"
    # Intra-op threads of torch in the worker process (None: torch's default, one per core).
    # Workers sharing a machine should split its cores: oversubscribed threads spin-wait.
    torch_threads: int | None = Field(default=None, ge=1)
    # Take ``shard`` from the trailing ordinal of the host name (``worker-3`` -> 3), as a
    # Kubernetes StatefulSet names its pods; overrides ``shard``.
    shard_from_hostname: bool = False
    # The demo HTTP API (services.client_sim.http): off unless a port is given.
    http_port: int | None = Field(default=None, ge=0, le=65535)
    http_host: str = "127.0.0.1"
    recommend_url: str = "http://127.0.0.1:8702"
    # How recommend_api names items: the dataset's own ids (it runs with FEDREC_REC_DATASET)
    # or catalogue indices as strings (it runs without labels).
    recommend_item_ids: Literal["dataset", "index"] = "dataset"

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.shard_from_hostname:
            self.shard = hostname_ordinal(socket.gethostname())
        # ``{shard}`` in the store path: one file per shard on a shared volume
        self.store = self.store.replace("{shard}", str(self.shard))
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ValueError(
                f"need 0 <= shard < shards, got shard={self.shard}, shards={self.shards}"
            )
        if self.poll_min_s <= 0 or self.poll_max_s < self.poll_min_s:
            raise ValueError("need 0 < poll_min_s <= poll_max_s")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        return self


class WorkerError(RuntimeError):
    """The worker cannot take part (wrong dataset, store of another shard, ...)."""


class Waiter(Protocol):
    """Waits between polls; may return early when something happened."""

    def wait(self, seconds: float) -> None:
        """Block for at most ``seconds``."""

    def close(self) -> None:
        """Release resources."""


class SleepWaiter:
    """Plain polling: sleep the whole interval."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``."""
        self._sleep(seconds)

    def close(self) -> None:
        """Nothing to release."""


class RedisWaiter:
    """Wakes up on a version event on ``fedrec:versions`` (or after the timeout)."""

    def __init__(self, url: str, channel: str = VERSIONS_CHANNEL) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(channel)
        self._error = redis.RedisError

    def wait(self, seconds: float) -> None:
        """Return on the first version event, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                msg = self._pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    log.debug("version event %r", msg.get("data"))
                    # drain what else is queued: one poll answers them all
                    while self._pubsub.get_message(timeout=0) is not None:
                        pass
                    return
        except self._error as err:
            log.warning("redis unavailable (%s); polling instead", err)
            time.sleep(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Unsubscribe and close the connection."""
        try:
            self._pubsub.close()
            self._redis.close()
        except self._error:  # pragma: no cover - closing a dead connection
            pass


class Worker:
    """One worker: its users, their store, and the aggregator client."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        split: Split | None = None,
        transport: httpx.BaseTransport | None = None,
        client: AggregatorClient | None = None,
        store: WorkerStore | None = None,
        waiter: Waiter | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.store = store or WorkerStore(settings.store)
        self._init_store(split)
        self.data = self.store.load_data()
        self.users = self.data.user_ids
        self._row = {int(u): i for i, u in enumerate(self.users)}
        self.client = client or AggregatorClient(
            settings.aggregator,
            token=self.store.get_meta("token"),
            transport=transport,
            timeout_s=settings.timeout_s,
            retry=RetryPolicy(retries=settings.retries, backoff_s=settings.backoff_s, sleep=sleep),
            max_body_bytes=settings.max_body_bytes,
        )
        if waiter is None:
            waiter = RedisWaiter(settings.redis_url) if settings.redis_url else SleepWaiter(sleep)
        self.waiter = waiter
        self.run_cfg: RunConfig | None = None
        self.last_info: RoundInfo | None = None
        self._refused: set[tuple[int, int]] = set()

    # ------------------------------------------------------------------ set-up

    def _init_store(self, split: Split | None) -> None:
        """On first start, copy the shard's users and their interactions into the store."""
        s = self.settings
        expect = {"shard": str(s.shard), "shards": str(s.shards), "dataset": s.dataset}
        if self.store.get_meta("dataset") is not None:
            for key, want in expect.items():
                have = self.store.get_meta(key)
                if have != want:
                    raise WorkerError(f"store {s.store} holds {key}={have}, not {want}")
            return
        if split is None:
            split = load_split(s.dataset, s.data_dir, validation=s.validation)
        users = np.flatnonzero(np.arange(split.n_users) % s.shards == s.shard)
        if len(users) == 0:
            raise WorkerError(f"shard {s.shard} of {s.shards} owns no user of {split.n_users}")
        self.store.add_users(split, users.tolist())
        self.store.set_meta(
            **expect,
            n_items=split.n_items,
            n_users=split.n_users,
            validation=int(split.has_validation),
        )
        log.info(
            "store %s: %d users of %s (shard %d/%d)",
            s.store,
            len(users),
            s.dataset,
            s.shard,
            s.shards,
        )

    def register(self) -> None:
        """Register the owned users once; the token is kept in the store."""
        token = self.store.get_meta("token")
        if token is not None:
            self.client.token = token
            return
        token = self.client.register(self.users.tolist())
        self.store.set_meta(token=token)
        log.info("registered %d clients", len(self.users))

    def _ensure_run(self, info: RoundInfo) -> RunConfig:
        """Adopt the run of ``info``: check it fits this worker; fresh states on a new run."""
        cfg = info.config
        assert cfg is not None
        if cfg.dataset != self.settings.dataset:
            raise WorkerError(
                f"run {info.run_id} is on dataset {cfg.dataset!r}, this worker "
                f"holds {self.settings.dataset!r}"
            )
        n_items = int(self.store.get_meta("n_items") or -1)
        if cfg.n_items != n_items:
            raise WorkerError(
                f"run {info.run_id} has {cfg.n_items} items, the local split has {n_items}"
            )
        run_id, key = str(info.run_id), model_key(cfg.model(), cfg.seed)
        if self.store.get_meta("run_id") != run_id:
            fresh = PrivateState.fresh(cfg.model(), cfg.seed, self.users)
            self.store.reset_states(self.users.tolist(), fresh)
            # a worker that joins late evaluates from the version it first sees
            first = max(0, (info.model_version or 0) - 1)
            self.store.set_meta(run_id=run_id, model_key=key, evaluated_version=first)
            log.info(
                "run %s: initialised %d private states (seed %d)", run_id, len(self.users), cfg.seed
            )
        elif self.store.get_meta("model_key") != key:
            raise WorkerError(f"run {run_id} changed its model or seed ({key})")
        self.run_cfg = cfg
        return cfg

    # ------------------------------------------------------------------ one poll

    def step(self) -> bool:
        """Poll once and do what the current round asks; True when something was done."""
        info = self.client.current_round()
        self.last_info = info
        if info.state == "idle" or info.config is None:
            return False
        if info.state == "finished" and str(info.run_id) != self.store.get_meta("run_id"):
            self.last_info = None  # a run this worker never joined: wait for the next one
            return False
        cfg = self._ensure_run(info)
        did = self.recover(info, cfg)
        version = info.model_version
        if version is not None:
            did = self.evaluate_up_to(version)
        if (
            info.state == "open"
            and info.cohort
            and version is not None
            and info.round_id is not None
        ):
            did = self.train(info, cfg, version) or did
        return did

    def evaluated_version(self) -> int:
        """The newest model version this worker has reported metrics for."""
        return int(self.store.get_meta("evaluated_version") or 0)

    def evaluate_up_to(self, version: int) -> bool:
        """Evaluate and report every version after the last evaluated one, up to ``version``."""
        done = self.evaluated_version()
        for v in range(done + 1, version + 1):
            self.evaluate(v)
        return version > done

    def evaluate(self, version: int) -> dict[str, float]:
        """Federated evaluation of model ``version`` over all owned users; report the sums."""
        model = self.client.download_model(version)
        scorer = Scorer(model.cfg, model.shared)
        params = self.store.load_states(self.users.tolist()).params
        d = self.data
        sums = metric_sums(scorer, params, d.test_items, d.test_negatives, KS)
        count = int(sums.pop("count"))
        if d.val_items is not None and d.val_negatives is not None:
            val = metric_sums(scorer, params, d.val_items, d.val_negatives, KS)
            val.pop("count")
            sums.update({f"val/{k}": v for k, v in val.items()})
        try:
            self.client.report_evaluation(version, sums, count, self.users.tolist())
        except AggregatorError as err:
            if err.retryable:
                raise
            log.warning("evaluation of version %d refused: %s", version, err)
        self.store.set_meta(evaluated_version=version)
        log.info(
            "version %d: evaluated %d users, hr@10 %.4f",
            version,
            count,
            sums.get("hr@10", 0.0) / max(count, 1),
        )
        return sums

    def pending(self, info: RoundInfo) -> list[int]:
        """Owned cohort members of the open round that have not committed its (round, attempt)."""
        assert info.round_id is not None
        cohort = sorted(int(u) for u in info.cohort if int(u) in self._row)
        progress = self.store.progress(cohort)
        return [
            u
            for u in cohort
            if (progress[u].last_round, progress[u].last_attempt) != (info.round_id, info.attempt)
        ]

    def _compute(self, cfg: RunConfig, version: int, round_id: int, todo: list[int]) -> StepResult:
        """The cohort step of ``todo`` for ``round_id`` from model ``version`` (deterministic)."""
        model = self.client.download_model(version)
        if model.cfg != cfg.model():
            raise WorkerError(
                f"model version {version} has shape {model.cfg}, the run announces {cfg.model()}"
            )
        hp = cfg.sam()
        samples = [
            client_samples(
                self.data.train[self._row[u]],
                cfg.n_items,
                hp.n_negatives,
                client_rng(cfg.seed, round_id, u),
            )
            for u in todo
        ]
        state = self.store.load_states(todo)
        return cohort_step(
            model.cfg, model.shared, np.asarray(todo, dtype=np.int64), state, samples, hp
        )

    def _upload_and_commit(
        self, r: int, a: int, version: int, todo: list[int], result: StepResult
    ) -> dict[int, str]:
        """Upload, then commit the new private states once the aggregator acknowledged them.

        A note of the upload is kept in the store while it is in flight: if the worker dies
        after the aggregator stored it but before the states are committed, :meth:`recover`
        recomputes the identical update (same model version, samples and states) and sends it
        again, which the aggregator answers as a duplicate even after the round has closed.
        """
        note = {"round": r, "attempt": a, "version": version, "users": todo}
        self.store.set_meta(pending_upload=json.dumps(note))
        try:
            statuses = self.client.upload(r, result.uploads)
        except AggregatorError as err:
            if err.retryable:
                raise
            # round closed meanwhile, not in the cohort after all, ...: keep the old state,
            # except for the users of the bodies that were accepted before the refusal
            done = [i for i, u in enumerate(todo) if u in err.partial]
            if done:
                self.store.save_states(
                    [todo[i] for i in done], result.state.select(np.asarray(done)), r, a
                )
            self.store.set_meta(pending_upload=None)
            log.warning(
                "round %d attempt %d: upload refused (%d of %d accepted before): %s",
                r,
                a,
                len(done),
                len(todo),
                err,
            )
            raise
        self.store.save_states(todo, result.state, r, a)
        self.store.set_meta(pending_upload=None)
        return statuses

    def recover(self, info: RoundInfo, cfg: RunConfig) -> bool:
        """Finish an upload a crash interrupted, if its round has moved on since."""
        raw = self.store.get_meta("pending_upload")
        if raw is None:
            return False
        note = json.loads(raw)
        r, a, version = int(note["round"]), int(note["attempt"]), int(note["version"])
        if info.state == "open" and (info.round_id, info.attempt) == (r, a):
            return False  # still open: train() recomputes and re-sends the same update
        progress = self.store.progress([int(u) for u in note["users"]])
        todo = [
            int(u)
            for u in note["users"]
            if (progress[int(u)].last_round, progress[int(u)].last_attempt) != (r, a)
        ]
        if not todo:
            self.store.set_meta(pending_upload=None)
            return False
        result = self._compute(cfg, version, r, todo)
        try:
            self._upload_and_commit(r, a, version, todo, result)
            log.info("round %d: recovered the interrupted upload of %d users", r, len(todo))
        except AggregatorError as err:
            if err.retryable:
                raise
            log.warning("round %d: the interrupted upload was never stored; its users miss it", r)
        return True

    def train(self, info: RoundInfo, cfg: RunConfig, version: int) -> bool:
        """Train, upload and commit the pending cohort members of the open round."""
        assert info.round_id is not None
        r, a = info.round_id, info.attempt
        if (r, a) in self._refused:
            return False
        todo = self.pending(info)
        if not todo:
            return False
        t0 = time.perf_counter()
        result = self._compute(cfg, version, r, todo)
        try:
            statuses = self._upload_and_commit(r, a, version, todo, result)
        except AggregatorError as err:
            if err.retryable:
                raise
            self._refused.add((r, a))
            return True
        n_dup = sum(1 for s in statuses.values() if s == "duplicate")
        log.info(
            "round %d attempt %d: trained %d users (%d accepted, %d duplicate), loss %.4f, %.2fs",
            r,
            a,
            len(todo),
            len(statuses) - n_dup,
            n_dup,
            float(result.losses.mean()),
            time.perf_counter() - t0,
        )
        return True

    # ------------------------------------------------------------------ the loop

    def finished(self) -> bool:
        """Whether the worker should stop: run finished (and evaluated) or max_rounds reached."""
        info = self.last_info
        if info is None or info.state == "idle":
            return False
        done = self.evaluated_version()
        mr = self.settings.max_rounds
        if mr is not None and done >= mr:
            return True
        return (
            self.settings.exit_when_finished
            and info.state == "finished"
            and done >= (info.model_version or 0)
        )

    def run(self) -> None:
        """Register, then follow rounds until :meth:`finished`."""
        self._register_patiently()
        delay = self.settings.poll_min_s
        while True:
            try:
                did = self.step()
            except AggregatorError as err:
                if not err.retryable:
                    raise
                log.warning("aggregator unavailable: %s", err)
                did = False
            if self.finished():
                log.info(
                    "stopping: evaluated version %d, state %s",
                    self.evaluated_version(),
                    self.last_info.state if self.last_info else "?",
                )
                return
            if did:
                delay = self.settings.poll_min_s
                continue
            self.waiter.wait(delay)
            delay = min(self.settings.poll_max_s, delay * 1.5)

    def _register_patiently(self) -> None:
        """Register, waiting out an aggregator that is not up yet (a deployment starts its
        pods in any order); a refusal (e.g. 409) still ends the worker."""
        delay = self.settings.poll_min_s
        while True:
            try:
                self.register()
                return
            except AggregatorError as err:
                if not err.retryable:
                    raise
                log.warning("cannot register yet: %s", err)
            self.waiter.wait(delay)
            delay = min(self.settings.poll_max_s, delay * 1.5)

    def close(self) -> None:
        """Close the client, the waiter and the store."""
        self.client.close()
        self.waiter.close()
        self.store.close()


def run_worker(settings: WorkerSettings, **kwargs: Any) -> None:
    """Run a worker until the run finishes (or ``max_rounds``); kwargs go to :class:`Worker`.

    With ``http_port`` set, the demo HTTP API (:mod:`services.client_sim.http`) is served from a
    background thread over the worker's own store for as long as the worker runs.
    """
    worker = Worker(settings, **kwargs)
    server = None
    try:
        if settings.http_port is not None:
            from services.client_sim.http import serve_in_thread

            server = serve_in_thread(settings, worker.store, split=kwargs.get("split"))
        worker.run()
    finally:
        if server is not None:
            server.stop()
        worker.close()
