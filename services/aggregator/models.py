"""SQLAlchemy 2.0 tables of the aggregator (the migrations in ``migrations/`` create them)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


#: A source of the current time (``utcnow``, or a test's settable clock).
Clock = Callable[[], datetime]


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Normalise to UTC before storing."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use UTC-aware ones")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Attach UTC when the backend returned a naive value."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of the aggregator's tables."""


class Run(Base):
    """A federated training run; ``active`` is 1 while running or paused, NULL after (unique)."""

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("active", name="uq_runs_active"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    active: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def ended(self) -> bool:
        """Whether the run finished its rounds or an operator stopped it (no round follows)."""
        return self.state in ("finished", "stopped")


class Client(Base):
    """A registered client (a user index); its credential is stored as a sha256 hash only."""

    __tablename__ = "clients"

    client_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)
    # The shard credential that registered it, ``"<shard>/<shards>"`` (NULL: registered before
    # enrolment tokens existed). ``token_hash`` is repository.RELEASED once the operator
    # released it: then an enrolment token of its shard may register it again.
    enrolled_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Round(Base):
    """One attempt of one round: its cohort, deadline, state and, once closed, its result."""

    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("run_id", "round_id", "attempt", name="uq_rounds_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    round_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    cohort: Mapped[list[int]] = mapped_column(JSON)
    base_version: Mapped[int] = mapped_column(Integer)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deadline: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    touched_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Updates stored for this attempt, kept equal to COUNT(updates) by the transactions that
    # insert or delete them (so an upload need not count the table to know the round is full).
    updates_received: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    n_updates: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    model_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # secure-aggregation runs: the protocol step the attempt is in (keys, shares, masked,
    # unmask; a sparse run's then masked_b, unmask_b); NULL on plain rounds
    secagg_phase: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # sparse secure aggregation, once its counts are unmasked: the public union U of the
    # attempt (sorted item ids), the rows its update instance lays out; NULL otherwise
    secagg_union: Mapped[list[int] | None] = mapped_column(JSON, nullable=True, deferred=True)
    # closed plain rounds: the clients whose upload the robust screen bounded (their norm,
    # sample count or loss was above its cap; fedrecgel/robust.py); NULL when none was
    bounded: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)


class StoredUpdate(Base):
    """One acknowledged client update.

    The row is the update's metadata, kept for good (the digest answers a retried upload);
    the body itself is an :class:`UpdateBlob`, deleted once the round attempt is over.
    """

    __tablename__ = "updates"
    __table_args__ = (
        UniqueConstraint("run_id", "round_id", "client_id", name="uq_updates_client"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_pk: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    round_id: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(64))
    n_samples: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class UpdateBlob(Base):
    """The body of a stored update (a one-update ``wire.encode_updates`` body: the client's own
    body when it held only this update, else a re-encoding of it), needed only while its
    round attempt is live (to rebuild it after a restart); ``storage.StorageKeeper`` deletes
    it once the attempt is over."""

    __tablename__ = "update_blobs"

    round_pk: Mapped[int] = mapped_column(ForeignKey("rounds.id"), primary_key=True)
    client_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


class SecAggMessage(Base):
    """One client's message of one secure-aggregation step of a round attempt: its public
    keys, its encrypted shares, or its revealed shares as sent (JSON), or, for a masked input,
    only its complaints (the vector itself is added to :class:`SecAggTotal` and not kept).
    ``digest`` (SHA-256 of the body as sent) tells a retry from a conflicting second message.
    ``instance``: the protocol instance ("a"; a sparse round's update instance "b").
    Deleted once the attempt is over."""

    __tablename__ = "secagg_messages"

    round_pk: Mapped[int] = mapped_column(ForeignKey("rounds.id"), primary_key=True)
    instance: Mapped[str] = mapped_column(String(1), primary_key=True, default="a")
    step: Mapped[str] = mapped_column(String(8), primary_key=True)
    client_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    digest: Mapped[str] = mapped_column(String(64))
    body: Mapped[bytes] = mapped_column(LargeBinary)


class SecAggTotal(Base):
    """The running sum (mod 2^w in the instance's little-endian words: uint64 for dense
    rounds) of a round attempt's masked inputs of one protocol instance, updated in the
    transaction that accepts each one; deleted once the attempt is over."""

    __tablename__ = "secagg_totals"

    round_pk: Mapped[int] = mapped_column(ForeignKey("rounds.id"), primary_key=True)
    instance: Mapped[str] = mapped_column(String(1), primary_key=True, default="a")
    total: Mapped[bytes] = mapped_column(LargeBinary)


class ModelVersion(Base):
    """An immutable model version: its round result; its shared params and server-optimizer
    state are :class:`VersionBlob` rows.

    The retention policy (``storage.RetentionPolicy``) prunes old versions: their params blob
    is deleted and ``pruned_at`` set, the row (digest, loss, metrics) stays. The optimizer
    state is kept for the newest version only (what the next round steps from).
    """

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("run_id", "version", name="uq_model_versions_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    round_id: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    n_updates: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Federated-evaluation means; written once, when the reports cover every registered client.
    metrics: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    pruned_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


#: the kinds of :class:`VersionBlob`
PARAMS, OPTIMIZER_STATE = "params", "optimizer_state"


class VersionBlob(Base):
    """A model version's encoded params (``kind`` "params") or server-optimizer state
    ("optimizer_state"). Apart from the version's row: SQLite rewrites a whole row on every
    update, so writing a version's metrics or freeing its optimizer state rewrote the
    megabytes of both blobs; here a freed blob is one deleted row."""

    __tablename__ = "version_blobs"

    version_pk: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


class EvaluationReport(Base):
    """One evaluation report: metric sums over a set of clients for one version."""

    __tablename__ = "evaluation_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sums: Mapped[dict[str, float]] = mapped_column(JSON)
    count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Evaluation(Base):
    """Which client was covered by which report, once per (run, version, client)."""

    __tablename__ = "evaluations"
    __table_args__ = (
        UniqueConstraint("run_id", "version", "client_id", name="uq_evaluations_client"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    version: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[int] = mapped_column(BigInteger)
    report_id: Mapped[int] = mapped_column(ForeignKey("evaluation_reports.id"))


class ItemCountReport(Base):
    """One worker's item counts over a set of its clients, for one run (the popularity prior):
    parallel lists of items and how many of the clients hold each."""

    __tablename__ = "item_count_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    items: Mapped[list[int]] = mapped_column(JSON)
    counts: Mapped[list[int]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ItemCountClient(Base):
    """Which client's items a count report covers, once per (run, client)."""

    __tablename__ = "item_count_clients"
    __table_args__ = (UniqueConstraint("run_id", "client_id", name="uq_item_count_clients"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    client_id: Mapped[int] = mapped_column(BigInteger)
    report_id: Mapped[int] = mapped_column(ForeignKey("item_count_reports.id"))


class RunPrior(Base):
    """A run's popularity prior, fixed once the count reports cover every registered client:
    the summed count of each item (little-endian int64, one per item)."""

    __tablename__ = "run_priors"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    # deferred: read only where the counts are sent (the ETag answer and the evaluation's
    # check that the prior is fixed need the row alone; the blob is 8 bytes an item)
    counts: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    clients: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RoundItemCounts(Base):
    """A sparse secure run's item counts summed over its rounds' unmasked instance A
    (:class:`fedrecgel.prior.RoundPrior`) until they fix its prior: per item the summed counts
    and the clients counted in rounds whose pool left it out (little-endian int64 each)."""

    __tablename__ = "round_item_counts"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    counts: Mapped[bytes] = mapped_column(LargeBinary)
    exposure: Mapped[bytes] = mapped_column(LargeBinary)
    counted: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
