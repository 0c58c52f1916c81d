"""The aggregator of one process, in parts with one job each:

* :class:`~services.aggregator.auth.Credentials`: bearer tokens and client registration;
* :class:`~services.aggregator.runs.RunLifecycle`: start, pause, resume and stop runs;
* :class:`~services.aggregator.reads.RunReads`: the current round, rounds, history, models;
* :class:`~services.aggregator.ingest.Ingest`: upload bodies, stored by group commit;
* :class:`~services.aggregator.secagg.SecureRounds`: the phases of secure aggregation;
* :class:`~services.aggregator.rounds.RoundCloser`: closing rounds (aggregation, retries) and
  resuming the live round after a restart;
* :class:`~services.aggregator.evaluation.Evaluations`: federated-evaluation reports;
* :class:`~services.aggregator.popularity.Priors`: the clients' item counts (popularity prior);
* :class:`~services.aggregator.health.HealthCheck`: the dependencies' health;
* :class:`~services.aggregator.storage.StorageKeeper`: freeing and compacting storage.

They share three pieces of in-memory state, each guarding itself with its own lock (see their
docstrings): :class:`~services.aggregator.modelstore.ModelStore` (encoded versions and the live
model), :class:`~services.aggregator.pending.PendingUpdates` (decoded updates of the live round)
and :class:`~services.aggregator.runs.NewestRun` (the newest run, for uploads). Every part is
synchronous (request handlers run it in worker threads) and opens its own transactions: an
upload must be committed *before* the round it completes is closed. Routes only translate HTTP
into calls of these parts; every query goes through
:class:`~services.aggregator.repository.Repository`.
"""

from __future__ import annotations

from services.aggregator.auth import Caller, Credentials
from services.aggregator.db import Database
from services.aggregator.evaluation import Evaluations
from services.aggregator.events import RedisBus
from services.aggregator.health import HealthCheck
from services.aggregator.ingest import Ingest
from services.aggregator.metrics import AggregatorMetrics
from services.aggregator.models import Clock, utcnow
from services.aggregator.modelstore import ModelStore
from services.aggregator.pending import PendingUpdates
from services.aggregator.popularity import Priors
from services.aggregator.reads import RunReads
from services.aggregator.rounds import CloseOutcome, RoundCloser
from services.aggregator.runs import NewestRun, RunLifecycle
from services.aggregator.secagg import SecureRounds
from services.aggregator.settings import Population, Settings
from services.aggregator.storage import RetentionPolicy, StorageKeeper

__all__ = ["AggregatorService", "Caller", "CloseOutcome"]


class AggregatorService:
    """The parts of one aggregator instance, wired together."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: AggregatorMetrics,
        bus: RedisBus | None = None,
        clock: Clock = utcnow,
        population: Population | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.bus = bus
        self.clock = clock
        self.models = ModelStore(settings.model_cache_versions)
        self.pending = PendingUpdates()
        self.newest = NewestRun(db)
        self.storage = StorageKeeper(
            db,
            RetentionPolicy(
                settings.keep_latest_versions, settings.keep_every_versions, settings.keep_runs
            ),
            settings.compact_interval_s,
            on_pruned=self.models.forget,
        )
        self.credentials = Credentials(
            db, settings, population.n_users if population else None, bus
        )
        self.runs = RunLifecycle(
            db, clock, self.models, self.pending, self.newest, settings.max_model_params, population
        )
        self.reads = RunReads(db, self.models)
        self.rounds = RoundCloser(
            db,
            metrics,
            clock,
            self.models,
            self.pending,
            self.storage,
            bus,
            settings.upload_screen_factor,
            settings.deadline_poll_s,
        )
        self.secure = SecureRounds(db, clock, self.rounds.advance)
        self.ingest = Ingest(db, metrics, clock, self.newest, self.pending, self.rounds.close_round)
        self.evaluations = Evaluations(db, clock, settings.max_register_per_request)
        self.priors = Priors(db, clock, settings.max_register_per_request)
        self.health = HealthCheck(db, bus)

    def tick(self) -> CloseOutcome | None:
        """The deadline task's step: close the live round when it is due."""
        return self.rounds.tick()

    def warm(self) -> None:
        """After a (re)start: rebuild the live model and the open round's updates."""
        self.rounds.warm()
