"""Every query of the aggregator, on one session (the service owns the transactions)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from services.aggregator.models import (
    OPTIMIZER_STATE,
    PARAMS,
    Client,
    ModelVersion,
    Round,
    Run,
    StoredUpdate,
    UpdateBlob,
    VersionBlob,
)

LIVE_ROUND_STATES = ("open", "paused")
#: the most values bound in one ``IN (...)`` list: far below every backend's limit on bound
#: variables (SQLite's 32766, PostgreSQL's 65535), whatever the request carried
IN_CHUNK = 1000
#: the credential hash of a client the operator released (``POST /v1/clients/release``):
#: never the sha256 hex of a token, so no credential holds it until it is registered again
RELEASED = "released"


def chunks(values: Iterable[int], size: int = IN_CHUNK) -> Iterator[list[int]]:
    """``values`` in lists of at most ``size`` (for ``IN`` lists of bounded length)."""
    batch: list[int] = []
    for v in values:
        batch.append(v)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def digests_by_client(
    session: Session, table: Any, client_ids: Iterable[int], *where: Any
) -> dict[int, str]:
    """``client_id -> digest`` of the rows of ``table`` (a model with both columns) that match
    ``where`` and belong to ``client_ids`` (queried in chunks of :data:`IN_CHUNK`)."""
    out: dict[int, str] = {}
    for part in chunks(client_ids):
        stmt = select(table.client_id, table.digest).where(*where, table.client_id.in_(part))
        out.update((int(c), d) for c, d in session.execute(stmt))
    return out


class Repository:
    """Queries over the aggregator's tables; never commits (the caller's transaction does)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    # ------------------------------------------------------------------ clients

    def existing_clients(self, client_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """Which of ``client_ids`` are registered: id -> (the hash of the credential holding
        it, or :data:`RELEASED`; the shard that enrolled it)."""
        out: dict[int, tuple[str, str | None]] = {}
        for part in chunks(client_ids):
            stmt = select(Client.client_id, Client.token_hash, Client.enrolled_by).where(
                Client.client_id.in_(part)
            )
            out.update((int(c), (h, e)) for c, h, e in self.session.execute(stmt))
        return out

    def add_clients(
        self, client_ids: Sequence[int], token_hash: str, enrolled_by: str | None = None
    ) -> None:
        """Register ``client_ids`` under one credential hash."""
        if not client_ids:
            return
        self.session.execute(
            insert(Client),
            [
                {"client_id": c, "token_hash": token_hash, "enrolled_by": enrolled_by}
                for c in client_ids
            ],
        )

    def move_clients(
        self,
        client_ids: Sequence[int],
        token_hash: str,
        held_by: str | None = None,
        enrolled_by: str | None = None,
    ) -> int:
        """Move registered clients to credential ``token_hash`` (the one holding them stops
        holding them); with ``held_by``, only those that credential (or :data:`RELEASED`)
        still holds; with ``enrolled_by``, it becomes their enrolling shard. How many moved."""
        values: dict[str, str] = {"token_hash": token_hash}
        if enrolled_by is not None:
            values["enrolled_by"] = enrolled_by
        moved = 0
        for part in chunks(client_ids):
            where: list[ColumnElement[bool]] = [Client.client_id.in_(part)]
            if held_by is not None:
                where.append(Client.token_hash == held_by)
            result = self.session.execute(
                update(Client)
                .where(*where)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            assert isinstance(result, CursorResult)
            moved += int(result.rowcount)
        return moved

    def clients_of_token(self, token_hash: str) -> list[int]:
        """The clients a credential holds (empty when the credential is unknown)."""
        rows = self.session.scalars(select(Client.client_id).where(Client.token_hash == token_hash))
        return list(rows)

    def all_client_ids(self) -> list[int]:
        """Every registered client id, ascending (a Core query: read each time a round opens,
        where the ORM's handling of each row cost more than the query)."""
        col = Client.__table__.c.client_id
        return list(self.session.connection().execute(select(col).order_by(col)).scalars().all())

    def count_clients(self) -> int:
        """Number of registered clients."""
        return int(self.session.scalar(select(func.count()).select_from(Client)) or 0)

    # ------------------------------------------------------------------ runs

    def add_run(self, config: dict[str, Any], now: datetime) -> Run:
        """Insert a running, active run."""
        run = Run(config=config, state="running", active=True, created_at=now)
        self.session.add(run)
        self.session.flush()
        return run

    def active_run(self) -> Run | None:
        """The run that is running or paused, if any."""
        return self.session.scalars(select(Run).where(Run.active.is_(True))).first()

    def latest_run(self) -> Run | None:
        """The most recently started run (the "current" one), if any."""
        return self.session.scalars(select(Run).order_by(Run.id.desc()).limit(1)).first()

    def latest_run_id(self) -> int | None:
        """The id of the most recently started run, without loading it."""
        value = self.session.scalar(select(func.max(Run.id)))
        return None if value is None else int(value)

    def get_run(self, run_id: int) -> Run | None:
        """A run by id."""
        return self.session.get(Run, run_id)

    # ------------------------------------------------------------------ rounds

    def add_round(
        self,
        run_id: int,
        round_id: int,
        attempt: int,
        cohort: list[int],
        base_version: int,
        opened_at: datetime,
        deadline: datetime,
    ) -> Round:
        """Insert an open round attempt."""
        rnd = Round(
            run_id=run_id,
            round_id=round_id,
            attempt=attempt,
            state="open",
            cohort=cohort,
            base_version=base_version,
            opened_at=opened_at,
            deadline=deadline,
        )
        self.session.add(rnd)
        self.session.flush()
        return rnd

    def get_round(self, pk: int) -> Round | None:
        """A round attempt by primary key (fresh from the database)."""
        return self.session.get(Round, pk, populate_existing=True)

    def live_round(self, run_id: int) -> Round | None:
        """The run's open or paused round attempt (at most one exists)."""
        stmt = select(Round).where(Round.run_id == run_id, Round.state.in_(LIVE_ROUND_STATES))
        return self.session.scalars(stmt.order_by(Round.id.desc()).limit(1)).first()

    def latest_attempt(self, run_id: int, round_id: int) -> Round | None:
        """The latest attempt of a round."""
        stmt = (
            select(Round)
            .where(Round.run_id == run_id, Round.round_id == round_id)
            .order_by(Round.attempt.desc())
            .limit(1)
        )
        return self.session.scalars(stmt).first()

    def last_round(self, run_id: int) -> Round | None:
        """The run's most recent round attempt, whatever its state."""
        stmt = select(Round).where(Round.run_id == run_id).order_by(Round.id.desc()).limit(1)
        return self.session.scalars(stmt).first()

    def closed_rounds(self, run_id: int, after: int = 0, limit: int | None = None) -> list[Round]:
        """The run's closed rounds after round ``after`` in order (the first ``limit``)."""
        stmt = (
            select(Round)
            .where(Round.run_id == run_id, Round.state == "closed", Round.round_id > after)
            .order_by(Round.round_id)
        )
        return list(self.session.scalars(stmt.limit(limit)))

    def transition_round(
        self, pk: int, from_states: Sequence[str], to_state: str, **values: Any
    ) -> bool:
        """Conditional state change (the guard that makes closing happen once): True if done.

        On PostgreSQL the row stays locked until the transaction ends; on SQLite the whole
        database is (BEGIN IMMEDIATE), so concurrent uploads and closes serialise here.
        """
        stmt = (
            update(Round)
            .where(Round.id == pk, Round.state.in_(list(from_states)))
            .values(state=to_state, **values)
            .execution_options(synchronize_session=False)
        )
        result = self.session.execute(stmt)
        assert isinstance(result, CursorResult)
        return result.rowcount == 1

    def touch_open_round(self, pk: int, now: datetime) -> int | None:
        """Lock an open round for an upload: its ``updates_received``, None when not open.

        The UPDATE takes the row lock on PostgreSQL (SQLite holds the database lock already),
        so a concurrent close waits for the upload's commit, or the upload sees it closed.
        """
        stmt = (
            update(Round)
            .where(Round.id == pk, Round.state == "open")
            .values(touched_at=now)
            .returning(Round.updates_received)
            .execution_options(synchronize_session=False)
        )
        value = self.session.execute(stmt).scalar_one_or_none()
        return None if value is None else int(value)

    def add_received(self, pk: int, n: int) -> None:
        """Count ``n`` more stored updates on a round attempt (same transaction as the rows)."""
        stmt = (
            update(Round)
            .where(Round.id == pk)
            .values(updates_received=Round.updates_received + n)
            .execution_options(synchronize_session=False)
        )
        self.session.execute(stmt)

    # ------------------------------------------------------------------ updates

    def update_digests(
        self, run_id: int, round_id: int, client_ids: Iterable[int]
    ) -> dict[int, str]:
        """Stored digests of the given clients' updates of a round: client -> digest."""
        return digests_by_client(
            self.session,
            StoredUpdate,
            client_ids,
            StoredUpdate.run_id == run_id,
            StoredUpdate.round_id == round_id,
        )

    def add_updates(self, rows: Sequence[dict[str, Any]]) -> None:
        """Store acknowledged updates: ``StoredUpdate`` column dicts plus their ``blob``, in
        one executemany INSERT per table.

        The caller also counts them on their round with :meth:`add_received`. A row whose
        ``blob`` is None (a client covered by a partial sum filed under its first client) has
        no body of its own.
        """
        if not rows:
            return
        blobs = [
            {"round_pk": r["round_pk"], "client_id": r["client_id"], "blob": r["blob"]}
            for r in rows
            if r["blob"] is not None
        ]
        self.session.execute(
            insert(StoredUpdate), [{k: v for k, v in r.items() if k != "blob"} for r in rows]
        )
        if blobs:
            self.session.execute(insert(UpdateBlob), blobs)

    def update_meta(self, round_pk: int) -> list[tuple[int, str]]:
        """(client id, digest) of every update of a round attempt, by client id."""
        stmt = (
            select(StoredUpdate.client_id, StoredUpdate.digest)
            .where(StoredUpdate.round_pk == round_pk)
            .order_by(StoredUpdate.client_id)
        )
        return [(int(c), d) for c, d in self.session.execute(stmt)]

    def update_blobs(self, round_pk: int, client_ids: Iterable[int]) -> dict[int, bytes]:
        """Stored bodies of some clients' updates of a live round attempt: client -> blob."""
        out: dict[int, bytes] = {}
        for part in chunks(client_ids):
            stmt = select(UpdateBlob.client_id, UpdateBlob.blob).where(
                UpdateBlob.round_pk == round_pk, UpdateBlob.client_id.in_(part)
            )
            out.update((int(c), b) for c, b in self.session.execute(stmt))
        return out

    def count_updates(self, round_pk: int) -> int:
        """Number of updates stored for a round attempt."""
        stmt = (
            select(func.count()).select_from(StoredUpdate).where(StoredUpdate.round_pk == round_pk)
        )
        return int(self.session.scalar(stmt) or 0)

    def release_finished_update_blobs(self) -> int:
        """Delete the bodies of the updates of every attempt that is over (closed, failed or
        aborted); their metadata rows stay. Returns how many were deleted."""
        finished = select(Round.id).where(Round.state.not_in(LIVE_ROUND_STATES))
        result = self.session.execute(
            delete(UpdateBlob)
            .where(UpdateBlob.round_pk.in_(finished))
            .execution_options(synchronize_session=False)
        )
        assert isinstance(result, CursorResult)
        return int(result.rowcount)

    def delete_updates(self, round_pk: int) -> None:
        """Drop the updates of a failed attempt (and zero its counter)."""
        self.session.execute(delete(UpdateBlob).where(UpdateBlob.round_pk == round_pk))
        self.session.execute(delete(StoredUpdate).where(StoredUpdate.round_pk == round_pk))
        self.session.execute(
            update(Round)
            .where(Round.id == round_pk)
            .values(updates_received=0)
            .execution_options(synchronize_session=False)
        )

    # ------------------------------------------------------------------ model versions

    def add_version(
        self,
        run_id: int,
        version: int,
        round_id: int,
        params: bytes,
        optimizer_state: bytes,
        digest: str,
        n_updates: int,
        loss: float | None,
        now: datetime,
    ) -> None:
        """Insert an immutable model version, its params and its optimizer state."""
        row = ModelVersion(
            run_id=run_id,
            version=version,
            round_id=round_id,
            digest=digest,
            n_updates=n_updates,
            loss=loss,
            created_at=now,
        )
        self.session.add(row)
        self.session.flush()
        self.session.execute(
            insert(VersionBlob),
            [
                {"version_pk": row.id, "kind": PARAMS, "blob": params},
                {"version_pk": row.id, "kind": OPTIMIZER_STATE, "blob": optimizer_state},
            ],
        )

    def latest_version_number(self, run_id: int) -> int | None:
        """The newest version of a run."""
        stmt = select(func.max(ModelVersion.version)).where(ModelVersion.run_id == run_id)
        value = self.session.scalar(stmt)
        return None if value is None else int(value)

    def latest_versions(self) -> dict[int, int]:
        """Every run's newest version: run id -> version."""
        stmt = select(ModelVersion.run_id, func.max(ModelVersion.version)).group_by(
            ModelVersion.run_id
        )
        return {int(r): int(v) for r, v in self.session.execute(stmt)}

    def version_meta(
        self, run_id: int, version: int, for_update: bool = False
    ) -> ModelVersion | None:
        """A version row without its blobs; ``for_update`` locks it until the transaction ends
        (PostgreSQL; SQLite transactions are serialized by BEGIN IMMEDIATE anyway)."""
        stmt = select(ModelVersion).where(
            ModelVersion.run_id == run_id, ModelVersion.version == version
        )
        if for_update:
            stmt = stmt.with_for_update()
        return self.session.scalars(stmt).first()

    def version_pruned(self, run_id: int, version: int) -> bool:
        """Whether a version of a run had its params pruned (False for one that never
        existed)."""
        stmt = select(ModelVersion.pruned_at).where(
            ModelVersion.run_id == run_id, ModelVersion.version == version
        )
        return self.session.scalar(stmt) is not None

    def version_with_blobs(
        self, run_id: int, version: int, kinds: Sequence[str] = (PARAMS, OPTIMIZER_STATE)
    ) -> tuple[ModelVersion, dict[str, bytes]] | None:
        """A version row and those of its blobs of ``kinds`` that are still kept (kind ->
        bytes; a pruned version has no params, an older one no optimizer state)."""
        row = self.version_meta(run_id, version)
        if row is None:
            return None
        stmt = select(VersionBlob.kind, VersionBlob.blob).where(
            VersionBlob.version_pk == row.id, VersionBlob.kind.in_(list(kinds))
        )
        return row, {str(k): bytes(b) for k, b in self.session.execute(stmt)}

    def _delete_version_blobs(self, kind: str, *where: ColumnElement[bool]) -> None:
        """Delete the ``kind`` blobs of the versions that match ``where``."""
        versions = select(ModelVersion.id).where(*where)
        self.session.execute(
            delete(VersionBlob)
            .where(VersionBlob.kind == kind, VersionBlob.version_pk.in_(versions))
            .execution_options(synchronize_session=False)
        )

    def drop_old_optimizer_states(self, run_id: int, latest: int) -> None:
        """Free the optimizer state of every version of a run older than ``latest``."""
        self._delete_version_blobs(
            OPTIMIZER_STATE, ModelVersion.run_id == run_id, ModelVersion.version < latest
        )

    def unpruned_versions(self, run_id: int) -> list[int]:
        """The versions of a run that still hold their params, ascending."""
        stmt = select(ModelVersion.version).where(
            ModelVersion.run_id == run_id, ModelVersion.pruned_at.is_(None)
        )
        return sorted(int(v) for v in self.session.scalars(stmt))

    def prune_versions(self, run_id: int, versions: Sequence[int], now: datetime) -> None:
        """Free the params of some versions of a run (their rows stay, ``pruned_at`` set)."""
        for part in chunks(versions):
            doomed = (ModelVersion.run_id == run_id, ModelVersion.version.in_(part))
            self._delete_version_blobs(PARAMS, *doomed)
            self.session.execute(
                update(ModelVersion)
                .where(*doomed)
                .values(pruned_at=now)
                .execution_options(synchronize_session=False)
            )

    def version_metrics(
        self, run_id: int, first: int, last: int
    ) -> dict[int, dict[str, float] | None]:
        """version -> federated-evaluation means (None until complete), versions first..last."""
        stmt = select(ModelVersion.version, ModelVersion.metrics).where(
            ModelVersion.run_id == run_id, ModelVersion.version.between(first, last)
        )
        return {int(v): m for v, m in self.session.execute(stmt)}

    def newest_evaluated_version(self, run_id: int) -> int | None:
        """The run's newest version with metrics, if any (the newest are looked at first)."""
        stmt = select(ModelVersion.version).where(
            ModelVersion.run_id == run_id, ModelVersion.metrics.is_not(None)
        )
        return self.session.scalar(stmt.order_by(ModelVersion.version.desc()).limit(1))

    def set_version_metrics(self, run_id: int, version: int, metrics: dict[str, float]) -> bool:
        """Write a version's metrics once (only while they are still unset)."""
        stmt = (
            update(ModelVersion)
            .where(
                ModelVersion.run_id == run_id,
                ModelVersion.version == version,
                ModelVersion.metrics.is_(None),
            )
            .values(metrics=metrics)
            .execution_options(synchronize_session=False)
        )
        result = self.session.execute(stmt)
        assert isinstance(result, CursorResult)
        return result.rowcount == 1
