"""A client-simulation worker: many users of one shard, trained round by round.

The worker owns the users ``u % shards == shard`` of a split. Each poll (:meth:`Worker.step`):

1. read the current round (a poll; or, after an upload of this worker closed a round, that
   upload's answer, which carries the next round); on a run not seen before, check its dataset
   and catalogue, and give every owned user a fresh private state (keyed by (seed, user), as
   the simulator does);
2. if the round is open and some owned users are in its cohort and have not committed this
   (round, attempt): download that round's model, draw their samples from
   ``client_rng(seed, round, user)`` and take the SAM step for them together (the core's
   :class:`fedrecgel.client_round.ClientRound`, as the simulator does), upload (their
   per-client updates, or with ``upload_grouping=worker`` one partial sum of them all), and
   only after the 2xx commit their new private state (one transaction);
3. evaluate the model versions the run evaluates (every ``eval_every``-th and the last) that
   it has not evaluated yet over ALL its users, with their
   private state as the store holds it, and report metric sums (federated evaluation,
   :mod:`services.client_sim.evaluation`). A version v is scored before the new states of
   round v + 1 are committed, so with the states after round v: in step 2 while the upload is
   in flight (in the worker's upload thread), the sums kept in the store with the commit and
   delivered from the upload thread after it, so neither the round nor the worker waits.

A crash between the upload and the commit leaves the old state in the store, so the restarted
worker recomputes the same update for the same users, which the server answers as a duplicate.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import httpx
import numpy as np
import torch

from fedrecgel.client_round import ClientRound
from fedrecgel.data import Split, load_split
from fedrecgel.privacy import ClientPrivacy
from fedrecgel.sam import PrivateState, StepResult
from fedrecgel.upload_modes import mode_of
from services.client_sim.aggregator_client import (
    AggregatorCallError,
    AggregatorClient,
    DownloadedModel,
)
from services.client_sim.evaluation import Evaluation
from services.client_sim.registration import register
from services.client_sim.secure import SecureParticipant
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import WorkerStore, model_key
from services.client_sim.timings import PhaseTimer
from services.client_sim.waiters import RedisWaiter, SleepWaiter, Waiter
from services.contract import CurrentRound, RunConfig
from services.priority import Background
from services.retry import RetryPolicy

log = logging.getLogger(__name__)


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
        self.store = store or WorkerStore(settings.store, mirror=True)
        self._init_store(split)
        self.data = self.store.load_data()
        self.users = self.data.user_ids
        self._row = {int(u): i for i, u in enumerate(self.users)}
        self.client = client or AggregatorClient(
            settings.aggregator,
            token=self.store.get_meta("token"),
            transport=transport,
            timeout_s=settings.timeout_s,
            retry=RetryPolicy(
                retries=settings.retries,
                backoff_s=settings.backoff_s,
                max_backoff_s=settings.max_backoff_s,
                give_up_after_s=settings.retry_deadline_s,
                sleep=sleep,
            ),
            max_body_bytes=settings.max_body_bytes,
        )
        if waiter is None:
            waiter = RedisWaiter(settings.redis_url) if settings.redis_url else SleepWaiter(sleep)
        self.waiter = waiter
        self.run_cfg: RunConfig | None = None
        self.last_info: CurrentRound | None = None
        self._refused: set[tuple[int, int]] = set()
        self.secure = SecureParticipant(self.client, self.store, self._compute, self.users.tolist())
        self.timer = PhaseTimer()
        self.evaluation = Evaluation(self.client, self.store, self.data, self.timer)
        #: the model version this step downloaded for its cohort (None: none yet)
        self._base: DownloadedModel | None = None
        #: the round after the one an upload of this worker closed, as its answer said: the
        #: next step starts from it instead of a poll
        self._announced: CurrentRound | None = None
        #: the kept evaluation reports being delivered by the upload thread
        self._delivering: Future[int] | None = None
        #: (round, attempt) of an upload that left its round open: the reports it kept are
        #: delivered once that round is over (:meth:`_deliver_if_over`), not while the
        #: aggregator takes the other uploads and closes it (a report then slows the close)
        self._deliver_when_over: tuple[int, int] | None = None
        #: whether the last step's upload left its round open for other workers' uploads
        #: (then polling again at once would only find it open: the loop waits first)
        self.left_open = False
        self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")

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
        """Register the owned users once (:func:`services.client_sim.registration.register`)."""
        register(self.client, self.store, self.settings, self.users.tolist())

    def _ensure_run(self, info: CurrentRound) -> RunConfig:
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
        self.evaluation.adopt(run_id, cfg)
        return cfg

    # ------------------------------------------------------------------ one poll

    def step(self) -> bool:
        """Poll once and do what the current round asks; True when something was done."""
        self._base = None
        self.left_open = False
        info, self._announced = self._announced, None
        if info is None:  # unless the upload that closed the last round answered the next one
            with self.timer.phase("poll"):
                info = self.client.current_round()
        self.timer.seen = time.time()
        self.last_info = info
        self._deliver_if_over(info)
        if info.state == "idle" or info.config is None:
            return False
        if info.state == "finished" and str(info.run_id) != self.store.get_meta("run_id"):
            self.last_info = None  # a run this worker never joined: wait for the next one
            return False
        cfg = self._ensure_run(info)
        assert info.run_id is not None  # (a run's round carries its id)
        self.evaluation.prior.report(info.run_id, cfg)
        did = self.recover(info, cfg)
        version = info.model_version
        trains = (
            info.state == "open"
            and bool(info.cohort)
            and version is not None
            and info.round_id is not None
        )
        plain = mode_of(cfg, cfg.model()).plain  # else the secure-aggregation phases
        if trains and plain and version is not None:
            # evaluates ``version`` itself, between its upload and its commit
            did = self.train(info, cfg, version) or did
        if version is not None:
            did = self.evaluate_up_to(version, info.state == "finished") or did
        if trains and not plain and version is not None:
            did = self.secure.step(info, cfg, version, self.pending(info)) or did
        return did

    def evaluated_version(self) -> int:
        """The newest model version this worker has reported metrics for."""
        return self.evaluation.reported()

    def evaluate_up_to(self, version: int, final: bool = False) -> bool:
        """Evaluate and report the versions after the last evaluated one up to ``version``
        that the run evaluates (``final``: ``version`` is the run's last), and deliver the
        reports kept but not delivered yet; while reports are being delivered in the
        background or wait for their round's end, only if there is a version to score (then
        waiting for them)."""
        busy = self._delivering is not None and not self._delivering.done()
        if (busy or self._deliver_when_over is not None) and not self.evaluation.due(
            version, final
        ):
            return False
        self.settle()
        self._deliver_when_over = None  # delivered below, with the rest
        return self.evaluation.up_to(version, self._base, final)

    def _deliver_if_over(self, info: CurrentRound) -> None:
        """Deliver (in the upload thread) the reports an upload kept, once its round is over."""
        due = self._deliver_when_over
        if due is None or (info.state == "open" and (info.round_id, info.attempt or 0) == due):
            return
        self._deliver_when_over = None
        self._deliver_in_background()

    def _deliver_in_background(self) -> None:
        """Deliver the kept reports from the upload thread, while this worker goes on (a
        delivery queued behind another finds what that one left kept)."""
        self._delivering = self._uploads.submit(self.evaluation.deliver)

    def settle(self) -> None:
        """Wait for the reports being delivered in the background (what they failed to deliver
        stays kept, for the next delivery)."""
        if self._delivering is not None:
            self._delivering.exception()
            self._delivering = None

    def pending(self, info: CurrentRound) -> list[int]:
        """Owned cohort members of the open round that have not committed its (round, attempt)."""
        assert info.round_id is not None
        cohort = sorted(int(u) for u in info.cohort if int(u) in self._row)
        progress = self.store.progress(cohort)
        return [
            u
            for u in cohort
            if (progress[u].last_round, progress[u].last_attempt)
            != (info.round_id, info.attempt or 0)
        ]

    def _compute(
        self, cfg: RunConfig, version: int, round_id: int, todo: list[int], cohort_size: int
    ) -> StepResult:
        """The cohort step of ``todo`` for ``round_id`` from model ``version`` (deterministic,
        but for the secret noise share of a distributed-DP run); a DP run's uploads are
        clipped (and noised) here, before they leave the worker."""
        with self.timer.phase("download"):
            model = self.client.download_model(version)
        self._base = model  # the evaluation of ``version`` in this step reuses it
        if model.cfg != cfg.model():
            raise WorkerError(
                f"model version {version} has shape {model.cfg}, the run announces {cfg.model()}"
            )
        dp = None
        if cfg.dp_enabled:
            dp = ClientPrivacy.announced(cfg.dp_clip, cfg.dp_noise, cfg.dp_mode, cohort_size)
        hp = replace(cfg.sam(), grouped_uploads=self.settings.grouped_uploads)
        clients = ClientRound(model.cfg, hp, cfg.seed, dp, secret_noise=True)
        # the client step writes its backward out: autograd would only record graphs (and the
        # simulator, whose numbers these are, runs without it)
        with self.timer.phase("compute"), torch.no_grad():
            state = self.store.load_states(todo)
            users = np.asarray(todo, dtype=np.int64)
            mode = mode_of(cfg, model.cfg)
            return mode.produce(clients, model.shared, round_id, users, self._train_items, state)

    def _train_items(self, user_id: int) -> np.ndarray:
        """The local training items of an owned user."""
        items: np.ndarray = self.data.train[self._row[user_id]]
        return items

    def _upload_and_commit(
        self, r: int, a: int, version: int, todo: list[int], result: StepResult
    ) -> dict[int, str]:
        """Upload, then commit the new private states once the aggregator acknowledged them.

        While the upload is in flight (a thread of its own: the aggregator's checks and group
        commit, and for a round's last upload its close, take a while), the model versions up
        to ``version`` (the round's base) are evaluated if they are not yet: the store still
        holds the states they are evaluated with (those after round ``version``), and neither
        the round's close nor the worker's next round waits for the evaluation.

        A note of the upload is kept in the store while it is in flight: if the worker dies
        after the aggregator stored it but before the states are committed, :meth:`recover`
        recomputes the identical update (same model version, samples and states) and sends it
        again, which the aggregator answers as a duplicate even after the round has closed.
        """
        note = {"round": r, "attempt": a, "version": version, "users": todo}
        with self.timer.phase("commit"):
            self.store.set_meta(pending_upload=json.dumps(note))
        sending = self._uploads.submit(self._send, r, todo, result)
        # scored before the commit changes the states, beside the upload
        scoring = Background(self.evaluation.score_up_to, version, self._base)
        sending.exception()  # the upload is waited for, even when the evaluation fails
        if self._announced is None:  # not the round's last upload: the round now waits for
            scoring.yield_cpu()  # another's and the close, not this (services/priority.py)
        scored = scoring.result()
        try:
            statuses = sending.result()
        except AggregatorCallError as err:
            self.evaluation.keep(scored)
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
        with self.timer.phase("commit"):  # the states, the scores kept, the note cleared:
            # one transaction (each is a commit, and a commit an fsync of the store)
            meta = {"pending_upload": None, **self.evaluation.meta(scored)}
            self.store.save_states(todo, result.state, r, a, meta=meta)
        if scored.scores and self._announced is None:  # the round waits for others' uploads
            self._deliver_when_over = (r, a)
        elif scored.scores:  # before this worker's next upload (the same thread)
            self._deliver_in_background()
        return statuses

    def _send(self, r: int, todo: list[int], result: StepResult) -> dict[int, str]:
        """Encode and post the upload of ``todo`` for round ``r`` (in the upload thread)."""
        assert self.run_cfg is not None
        with self.timer.phase("encode"):
            mode = mode_of(self.run_cfg, self.run_cfg.model())
            bodies = mode.bodies(r, result, self.client.split_bodies)
        with self.timer.phase("upload"):
            statuses, self._announced = self.client.upload_bodies_closing(r, bodies)
        return statuses

    def recover(self, info: CurrentRound, cfg: RunConfig) -> bool:
        """Finish an upload a crash interrupted, if its round has moved on since."""
        raw = self.store.get_meta("pending_upload")
        if raw is None:
            return False
        note = json.loads(raw)
        r, a, version = int(note["round"]), int(note["attempt"]), int(note["version"])
        if info.state == "open" and (info.round_id, info.attempt or 0) == (r, a):
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
        # (a distributed-DP share is drawn afresh: the aggregator then refuses the recomputed
        # upload as conflicting and these users miss the round)
        result = self._compute(cfg, version, r, todo, len(note["users"]))
        try:
            self._upload_and_commit(r, a, version, todo, result)
            log.info("round %d: recovered the interrupted upload of %d users", r, len(todo))
        except AggregatorCallError as err:
            if err.retryable:
                raise
            log.warning("round %d: the interrupted upload was never stored; its users miss it", r)
        return True

    def train(self, info: CurrentRound, cfg: RunConfig, version: int) -> bool:
        """Train, upload and commit the pending cohort members of the open round."""
        assert info.round_id is not None
        r, a = info.round_id, info.attempt or 0
        if (r, a) in self._refused:
            return False
        todo = self.pending(info)
        if not todo:
            return False
        t0 = time.perf_counter()
        result = self._compute(cfg, version, r, todo, info.cohort_size)
        try:
            statuses = self._upload_and_commit(r, a, version, todo, result)
        except AggregatorCallError as err:
            if err.retryable:
                raise
            self._refused.add((r, a))
            return True
        self.left_open = self._announced is None
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
        log.info("%s", self.timer.line(r, self.timer.take()))
        return True

    # ------------------------------------------------------------------ the loop

    def finished(self) -> bool:
        """Whether the worker should stop: run finished or max_rounds reached, and every
        version up to there scored and its report delivered (waited for here)."""
        info = self.last_info
        if info is None or info.state == "idle":
            return False
        scored, mr = self.evaluation.done(), self.settings.max_rounds
        if mr is not None and scored >= mr:
            target = mr
        elif (
            self.settings.exit_when_finished
            and info.state == "finished"
            and scored >= (info.model_version or 0)
        ):
            target = info.model_version or 0
        else:
            return False
        self.settle()
        self._deliver_when_over = None  # delivered here
        try:
            self.evaluation.deliver()
        except AggregatorCallError as err:
            if not err.retryable:
                raise
            log.warning("aggregator unavailable: %s", err)
        return self.evaluated_version() >= target

    def close(self) -> None:
        """Close the upload thread, the client, the waiter and the store."""
        self._uploads.shutdown(wait=True)
        self.client.close()
        self.waiter.close()
        self.store.close()
