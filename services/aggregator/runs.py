"""Run lifecycle: starting a run (version 0, round 1), pausing, resuming and stopping it, and
opening round attempts with their cohorts."""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy.exc import IntegrityError

from fedrecgel.cohort import groups_summary, select_cohort
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.server_strategy import strategy_of
from fedrecgel.upload_modes import UploadMode, mode_of
from fedrecgel.wire import encode_model, encode_state
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Malformed
from services.aggregator.models import Clock, Round
from services.aggregator.modelstore import ModelState, ModelStore
from services.aggregator.pending import PendingUpdates
from services.aggregator.privacy import private_strategy, run_plan
from services.aggregator.repository import Repository
from services.aggregator.schemas import RunConfig, RunStarted, RunStatus
from services.aggregator.settings import Population
from services.contract import ModelBlob

log = logging.getLogger(__name__)


class RunAction(enum.StrEnum):
    """An operator action on the active run."""

    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"


@dataclass(frozen=True)
class RunRef:
    """The newest run as uploads need it: its id, model shape and settings."""

    run_id: int
    model: ModelConfig
    config: RunConfig

    @property
    def mode(self) -> UploadMode:
        """The run's upload mode."""
        return mode_of(self.config, self.model)


class NewestRun:
    """The newest run's :class:`RunRef`, cached for uploads.

    A run's config never changes, so the cache can only be stale by a newer run having been
    started, here (:meth:`set`) or by a replica; ingest detects the latter inside its write
    transaction and calls :meth:`get` with ``refresh``. Locking: ``_lock`` guards ``_ref``
    only; a newer run id always wins, so concurrent refreshes cannot go back in time.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._ref: RunRef | None = None

    def set(self, ref: RunRef) -> None:
        """A run was started here."""
        with self._lock:
            if self._ref is None or self._ref.run_id <= ref.run_id:
                self._ref = ref

    def get(self, refresh: bool = False) -> RunRef:
        """The newest run (409 when no run was ever started)."""
        with self._lock:
            cached = self._ref
        if cached is not None and not refresh:
            return cached
        with self.db.read() as s:
            run = Repository(s).latest_run()
            if run is None:
                raise Conflict("no run has been started", "round_not_open")
            cfg = RunConfig.model_validate(run.config)
            ref = RunRef(run.id, cfg.model(), cfg)
        self.set(ref)
        return ref


def open_round(
    repo: Repository,
    run_id: int,
    cfg: RunConfig,
    round_id: int,
    attempt: int,
    base_version: int,
    candidates: list[int] | None,
    now: datetime,
) -> Round:
    """Insert a round attempt with its cohort drawn from the registered clients."""
    ids = np.asarray(candidates if candidates is not None else repo.all_client_ids())
    cohort = select_cohort(
        ids, cfg.fraction, cfg.seed, round_id, attempt, cfg.sampling, cfg.cohort_groups
    )
    deadline = now + timedelta(seconds=cfg.deadline_s)
    rnd = repo.add_round(
        run_id, round_id, attempt, [int(c) for c in cohort], base_version, now, deadline
    )
    if cfg.secure_aggregation != "off":
        rnd.secagg_phase = "keys"  # the first step of the protocol (services/aggregator/secagg)
    return rnd


def check_cohorts(cfg: RunConfig, n_clients: int) -> None:
    """422 unless the run's upload mode takes its cohorts of ``n_clients`` registered clients
    (a secure run's: at least two clients each, and none, at most every registered client,
    can overflow the fixed-point ring)."""
    try:
        mode_of(cfg, cfg.model()).check_cohorts(n_clients, n_clients)
    except ValueError as err:
        raise Malformed(str(err), "invalid_config") from None


def check_settings(cfg: RunConfig) -> None:
    """422 for settings no run takes whatever the clients: DP with secure aggregation."""
    if cfg.secure_aggregation != "off" and cfg.dp_enabled:
        raise Malformed(
            "differential privacy together with secure aggregation is not supported: choose one",
            "unsupported_setting",
        )


def check_before_start(cfg: RunConfig, n_clients: int) -> None:
    """What :meth:`RunLifecycle.start_run` refuses (422) of a run over ``n_clients`` registered
    clients, checked without a database: a launcher asks before it starts any service."""
    check_settings(cfg)
    run_plan(_Counted(n_clients), cfg)  # type: ignore[arg-type]
    check_cohorts(cfg, n_clients)


@dataclass
class _Counted:
    """The one query :func:`run_plan` makes of a repository: the registered clients."""

    n: int

    def count_clients(self) -> int:
        return self.n


class RunLifecycle:
    """Start, pause, resume and stop runs (the operator's actions); every one is a single
    transaction, and only the active run (``runs.active``, unique) is ever changed."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        models: ModelStore,
        pending: PendingUpdates,
        newest: NewestRun,
        max_model_params: int,
        population: Population | None = None,
    ) -> None:
        self.db = db
        self.population = population
        self.clock = clock
        self.models = models
        self.pending = pending
        self.newest = newest
        self.max_model_params = max_model_params

    def _check_catalogue(self, cfg: RunConfig) -> None:
        """A population read from a dataset fixes the run's dataset and catalogue, one given
        as a number with its catalogue size the catalogue: its workers hold that dataset and
        stop on a run over another one (422 before anything starts)."""
        p = self.population
        if p is None or p.n_items is None:
            return
        if p.dataset is not None and (cfg.dataset != p.dataset or cfg.n_items != p.n_items):
            raise Malformed(
                f"this aggregator's clients are the users of {p.dataset} ({p.n_items} items, "
                f"FEDREC_AGG_POPULATION_DATASET); the run names dataset={cfg.dataset!r} with "
                f"n_items={cfg.n_items}, which its workers would refuse",
                "invalid_config",
            )
        if cfg.n_items != p.n_items:
            raise Malformed(
                f"this aggregator's {p.n_users} clients hold a catalogue of {p.n_items} items "
                f"(FEDREC_AGG_POPULATION_ITEMS); the run names n_items={cfg.n_items}, which "
                "its workers would refuse",
                "invalid_config",
            )

    def start_run(self, cfg: RunConfig) -> RunStarted:
        """Start a run: version 0 = init_shared(model, seed), round 1 open.

        Nothing is allocated before the run may start: a model over ``max_model_params``
        shared parameters is refused (422), and so is a start while a run is active or no
        client is registered (409); the transaction below checks the latter again.
        """
        check_settings(cfg)
        self._check_catalogue(cfg)
        mcfg = cfg.model()
        n_params = sum(math.prod(shape) for shape in mcfg.shared_shapes().values())
        if n_params > self.max_model_params:
            raise Malformed(
                f"the model would have {n_params} shared parameters; this aggregator builds at "
                f"most {self.max_model_params} (FEDREC_AGG_MAX_MODEL_PARAMS)",
                "model_too_large",
            )
        with self.db.transaction() as s:
            self._check_can_start(Repository(s))
            plan = run_plan(Repository(s), cfg)  # 422 if its target epsilon cannot be met
            check_cohorts(cfg, Repository(s).count_clients())
        params = init_shared(mcfg, cfg.seed)
        strategy = strategy_of(cfg)
        strategy = private_strategy(strategy, plan, mcfg)
        state = strategy.state_dict()
        blob = encode_model(mcfg, params, 0)
        digest = hashlib.sha256(blob).hexdigest()
        now = self.clock()
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                self._check_can_start(repo)
                candidates = repo.all_client_ids()
                run = repo.add_run(cfg.model_dump(mode="json"), now)
                repo.add_version(run.id, 0, 0, blob, encode_state(state), digest, 0, None, now)
                rnd = open_round(repo, run.id, cfg, 1, 0, 0, candidates, now)
                run_id, cohort_size = run.id, len(rnd.cohort)
        except IntegrityError:
            raise Conflict("a run is already active", "run_active") from None
        self.newest.set(RunRef(run_id, mcfg, cfg))
        self.models.put_state(ModelState(run_id, 0, params, strategy))
        self.models.remember(ModelBlob(run_id, 0, blob, digest))
        log.info("run %d started: %d rounds, cohort %d", run_id, cfg.rounds, cohort_size)
        if cfg.cohort_groups is not None:
            log.info(
                "run %d: %s",
                run_id,
                groups_summary(np.asarray(candidates), cfg.cohort_groups, cfg.seed),
            )
        return RunStarted(
            run_id=run_id,
            state="running",
            round_id=1,
            model_version=0,
            cohort_size=cohort_size,
            config=cfg,
        )

    @staticmethod
    def _check_can_start(repo: Repository) -> None:
        if repo.active_run() is not None:
            raise Conflict("a run is already active", "run_active")
        if repo.count_clients() == 0:
            raise Conflict("no clients are registered", "no_clients")

    def pause_run(self) -> RunStatus:
        """Pause the active run: uploads are refused and no deadline runs until resumed."""
        return self.apply(RunAction.PAUSE)

    def resume_run(self) -> RunStatus:
        """Resume a paused run; the open round gets a fresh deadline."""
        return self.apply(RunAction.RESUME)

    def stop_run(self) -> RunStatus:
        """Stop the active run for good; its live round is aborted."""
        return self.apply(RunAction.STOP)

    def apply(self, action: RunAction) -> RunStatus:
        """One operator action on the active run (409 when none is active, or when its round
        is being closed at this moment). Pausing a paused run, or resuming a running one,
        changes nothing."""
        now = self.clock()
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.active_run()
            if run is None:
                raise Conflict("no run is active", "no_run")
            cfg = RunConfig.model_validate(run.config)
            live = repo.live_round(run.id)
            if action is RunAction.PAUSE and run.state == "running":
                if live is not None and not repo.transition_round(live.id, ["open"], "paused"):
                    raise Conflict("the round is closing; retry", "round_closing")
                run.state = "paused"
            elif action is RunAction.RESUME and run.state == "paused":
                if live is not None:
                    deadline = now + timedelta(seconds=cfg.deadline_s)
                    # touched_at: marked alive now (services.aggregator.deadlines)
                    repo.transition_round(
                        live.id, ["paused"], "open", deadline=deadline, touched_at=now
                    )
                run.state = "running"
            elif action is RunAction.STOP:
                if live is not None and not repo.transition_round(
                    live.id, ["open", "paused"], "aborted", closed_at=now
                ):
                    raise Conflict("the round is closing; retry", "round_closing")
                run.state, run.active, run.finished_at = "stopped", None, now
            status = RunStatus(
                run_id=run.id,
                state=run.state,  # type: ignore[arg-type]
                round_id=None if live is None else live.round_id,
            )
        if action is RunAction.STOP and live is not None:
            self.pending.drop(live.id)
        log.info("run %d: %s -> %s", status.run_id, action.value, status.state)
        return status
