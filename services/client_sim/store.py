"""The worker's local store: each owned user's private state and local interactions.

One row per user (SQLAlchemy 2.0, a SQLite file by default):

* ``state``: params + Adam moments as one safetensors blob (:func:`fedrecgel.wire.encode_state`,
  keys ``params/<name>``, ``exp_avg/<name>``, ``exp_avg_sq/<name>``); NULL until the run's
  model shape is known; ``step`` the user's Adam step count;
* ``last_round`` / ``last_attempt``: the (round, attempt) whose update was last committed;
* ``interactions``: the user's local data as a safetensors blob (``train`` item ids, ``test``
  item, ``test_negatives``, and ``val`` / ``val_negatives`` when the split has validation).

A ``meta`` table holds the worker's token, run id, shard and dataset. Nothing here is pickled,
and nothing here is ever sent to the aggregator: the worker only uploads gradients of the
shared parameters and metric sums.

A SQLite store file is private: created (or narrowed to) mode 0600 before SQLite opens it, so
its journal, ``-wal`` and ``-shm`` files (SQLite gives them the database file's mode) are 0600
too; it runs in WAL mode, so the device API reads while the worker loop writes.

The worker opens its store with ``mirror=True``: every owned user's private state is then also
held in memory (built from the database on the first load, updated after each committed save),
so loading states (the cohort's each round, all users' for each evaluation) is a row selection
instead of decoding a blob per user. The database stays the record: a save updates the mirror
only once its transaction committed, and a restarted worker rebuilds the mirror from the file.
Only the process that writes the store may mirror it (another one's mirror would go stale).
The mirroring store also keeps its small ``meta`` table in memory, written through in the same
way (each poll reads a few meta values, each a transaction of its own before).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sqlalchemy import Integer, LargeBinary, String, create_engine, event, inspect, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from fedrecgel.data import Split
from fedrecgel.model import ModelConfig
from fedrecgel.sam import PrivateState
from fedrecgel.wire import decode_state
from services.client_sim.store_codec import (
    DATA_FORMAT,
    StoreError,
    decode_private,
    encode_private,
    encode_private_rows,
    encode_user_data,
)
from services.client_sim.store_files import make_private_store, sqlite_file

__all__ = [
    "Progress",
    "StoreError",
    "UserData",
    "UserRow",
    "WorkerStore",
    "decode_private",
    "encode_private",
    "encode_private_rows",
    "model_key",
]

_CHUNK = 500  # rows per IN (...) query


class _Base(DeclarativeBase):
    pass


class UserRow(_Base):
    """One owned user: private state, its progress and local interactions."""

    __tablename__ = "users"

    user_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    last_round: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    interactions: Mapped[bytes] = mapped_column(LargeBinary)


class MetaRow(_Base):
    """A key/value fact about the worker (token, run id, shard, dataset, ...)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(4096))


@dataclass(frozen=True)
class UserData:
    """Local interactions of the owned users, aligned with ``user_ids`` (sorted).

    train: per user its training item ids; test_items (U,); test_negatives (U, N);
    val_items (U,) and val_negatives (U, N) when the split has validation.
    """

    user_ids: np.ndarray
    train: list[np.ndarray]
    test_items: np.ndarray
    test_negatives: np.ndarray
    val_items: np.ndarray | None
    val_negatives: np.ndarray | None


@dataclass(frozen=True)
class Progress:
    """Committed (round, attempt) of one user; None when it has never trained in this run."""

    last_round: int | None
    last_attempt: int | None


def _wal_mode(dbapi_connection: Any, connection_record: Any) -> None:
    """Each SQLite connection in WAL mode: a reader never waits for the writer."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _write_meta(s: Session, values: Mapping[str, str | int | None]) -> None:
    """Set (or, with None, delete) meta values in the session's transaction."""
    for key, value in values.items():
        row = s.get(MetaRow, key)
        if value is None:
            if row is not None:
                s.delete(row)
        elif row is None:
            s.add(MetaRow(key=key, value=str(value)))
        else:
            row.value = str(value)


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), _CHUNK):
        yield [int(u) for u in ids[start : start + _CHUNK]]


class WorkerStore:
    """The private-state store of one worker (open with a path or an SQLAlchemy URL)."""

    def __init__(self, path_or_url: str | Path, *, mirror: bool = False) -> None:
        url = str(path_or_url)
        if "://" not in url:
            url = f"sqlite:///{Path(url).expanduser()}"
        shown = "the store URL"  # until parsed: a URL may hold a password
        try:
            shown = make_url(url).render_as_string(hide_password=True)
            self._open(url)
        except (ArgumentError, ImportError, SQLAlchemyError) as err:
            # an unknown dialect, an absent driver, not a database, a folder, no permission
            cause = getattr(err, "orig", None) or err
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise StoreError(f"cannot open the store {shown}: {reason}") from None
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self._mirroring = mirror
        #: every owned user's committed state (rows in ``_mirror_ids`` order), once built
        self._mirror: PrivateState | None = None
        self._mirror_ids = np.zeros(0, dtype=np.int64)
        self._mirror_lock = threading.Lock()  # the device API reads from another thread
        #: with ``mirror``, the whole meta table (loaded on first use, written through)
        self._meta: dict[str, str] | None = None
        self._meta_lock = threading.Lock()
        #: with ``mirror``, every owned user's committed (round, attempt), once read
        self._progress: dict[int, Progress] | None = None
        self._progress_lock = threading.Lock()

    def _open(self, url: str) -> None:
        """Create the engine and the schema (refusing another service's database)."""
        path = sqlite_file(url)
        existed = path is not None and path.exists()
        if path is not None and not existed:  # created private, before SQLite writes to it
            make_private_store(path)
        self.engine: Engine = create_engine(url)
        if path is not None:
            event.listen(self.engine, "connect", _wal_mode)
        if foreign := set(inspect(self.engine).get_table_names()) - set(_Base.metadata.tables):
            # another service's database (the aggregator's, say): never touch it
            self.engine.dispose()
            raise StoreError(
                f"{path or url} is not a worker store: it holds the tables {sorted(foreign)[:5]}"
            )
        if path is not None and existed:
            make_private_store(path)
        _Base.metadata.create_all(self.engine)

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> str | None:
        """A meta value, or None."""
        if self._mirroring:
            return self._cached_meta().get(key)
        with self._session() as s:
            row = s.get(MetaRow, key)
            return None if row is None else row.value

    def set_meta(self, **values: str | int | None) -> None:
        """Set (or, with None, delete) several meta values in one transaction."""
        with self._meta_lock:  # the copy changes only with the commit, in commit order
            with self._session.begin() as s:
                _write_meta(s, values)
            self._mirror_meta(values)

    def _mirror_meta(self, values: Mapping[str, str | int | None]) -> None:
        """Committed meta values into the in-memory copy (held: ``_meta_lock``)."""
        if self._meta is not None:
            for key, value in values.items():
                if value is None:
                    self._meta.pop(key, None)
                else:
                    self._meta[key] = str(value)

    def meta_like(self, prefix: str) -> dict[str, str]:
        """Every meta value whose key starts with ``prefix``."""
        if self._mirroring:
            return {k: v for k, v in self._cached_meta().items() if k.startswith(prefix)}
        with self._session() as s:
            q = select(MetaRow.key, MetaRow.value).where(
                MetaRow.key.startswith(prefix, autoescape=True)
            )
            return {k: v for k, v in s.execute(q)}

    def _cached_meta(self) -> dict[str, str]:
        """The mirrored meta table (a copy: read without the lock); loaded on first use. Each
        poll reads a few meta values, and each was a transaction of its own."""
        with self._meta_lock:
            if self._meta is None:
                with self._session() as s:
                    self._meta = {k: v for k, v in s.execute(select(MetaRow.key, MetaRow.value))}
            return dict(self._meta)

    # ------------------------------------------------------------------ users and data

    def user_ids(self) -> np.ndarray:
        """The owned users, sorted."""
        with self._session() as s:
            ids = s.scalars(select(UserRow.user_id).order_by(UserRow.user_id)).all()
        return np.asarray(ids, dtype=np.int64)

    def add_users(self, split: Split, user_ids: Sequence[int]) -> None:
        """Store the local interactions of ``user_ids`` (no private state yet), one transaction."""
        with self._session.begin() as s:
            for u in user_ids:
                s.add(
                    UserRow(
                        user_id=int(u),
                        state=None,
                        step=0,
                        last_round=None,
                        last_attempt=None,
                        interactions=encode_user_data(split, int(u)),
                    )
                )

    def load_data(self) -> UserData:
        """The local interactions of every owned user."""
        train, test, test_neg, val, val_neg = [], [], [], [], []
        with self._session() as s:
            rows = s.execute(
                select(UserRow.user_id, UserRow.interactions).order_by(UserRow.user_id)
            ).all()
        ids = []
        for uid, blob in rows:
            tensors, meta = decode_state(blob)
            if meta.get("format") != DATA_FORMAT:
                raise StoreError(f"user {uid}: not a user-data blob")
            ids.append(uid)
            train.append(tensors["train"].numpy())
            test.append(int(tensors["test"][0]))
            test_neg.append(tensors["test_negatives"].numpy())
            if "val" in tensors:
                val.append(int(tensors["val"][0]))
                val_neg.append(tensors["val_negatives"].numpy())
        n_neg = test_neg[0].shape[0] if test_neg else 0
        has_val = bool(ids) and len(val) == len(ids)
        return UserData(
            user_ids=np.asarray(ids, dtype=np.int64),
            train=train,
            test_items=np.asarray(test, dtype=np.int64),
            test_negatives=(
                np.stack(test_neg) if test_neg else np.zeros((0, n_neg), dtype=np.int64)
            ),
            val_items=np.asarray(val, dtype=np.int64) if has_val else None,
            val_negatives=np.stack(val_neg) if has_val else None,
        )

    def train_items(self, user_id: int) -> np.ndarray | None:
        """The training item indices of one owned user (None: not a user of this store)."""
        with self._session() as s:
            blob = s.scalar(select(UserRow.interactions).where(UserRow.user_id == int(user_id)))
        if blob is None:
            return None
        tensors, meta = decode_state(blob)
        if meta.get("format") != DATA_FORMAT:
            raise StoreError(f"user {user_id}: not a user-data blob")
        items: np.ndarray = tensors["train"].numpy()
        return items

    # ------------------------------------------------------------------ private state

    def has_state(self) -> bool:
        """Whether every owned user has a private state."""
        with self._session() as s:
            missing = s.scalars(select(UserRow.user_id).where(UserRow.state.is_(None)).limit(1))
            return missing.first() is None

    def reset_states(self, user_ids: Sequence[int], state: PrivateState) -> None:
        """Replace the state of ``user_ids`` (a new run) and forget their progress. The mirror
        is dropped first: a new run's model may have other private widths (another factor or
        kind), which the old one cannot hold. When the reset covers every owned user in id
        order (a worker's new run), the mirror is then a copy of the committed ``state``;
        otherwise it is rebuilt from the file when next read (a blob decoded per user)."""
        with self._mirror_lock:
            self._mirror = None
        self.save_states(user_ids, state, None, None)
        if self._mirroring:
            self._mirror_reset(user_ids, state)

    def _mirror_reset(self, user_ids: Sequence[int], state: PrivateState) -> None:
        """After a committed reset of every owned user (rows of ``state`` in id order): the
        mirror is a copy of it, unless one was built from the file meanwhile (the device API's
        thread), which then holds the same states."""
        ids = np.asarray(user_ids, dtype=np.int64).reshape(-1)
        if len(ids) != len(state.step):
            return
        owned = self.user_ids()
        if not np.array_equal(ids, owned):
            return
        copy = state.select(slice(0, len(ids)))
        with self._mirror_lock:
            if self._mirror is None:
                self._mirror, self._mirror_ids = copy, owned

    def load_states(self, user_ids: Sequence[int]) -> PrivateState:
        """The private state of ``user_ids`` (in that order; copies, from the mirror when the
        store keeps one)."""
        if self._mirroring:
            if self._mirror is None:
                self._build_mirror()
            with self._mirror_lock:
                rows = self._mirror_rows(user_ids)
                if self._mirror is not None and rows is not None:
                    return self._mirror.select(rows)
        return self._load_from_db(user_ids)

    def _build_mirror(self) -> None:
        """Load every owned user's state into the mirror, once all of them have one.

        Under the lock from the read to the assignment: a save that commits meanwhile (the
        worker's thread, while the device API's builds) then waits for the mirror and writes
        its states into it, rather than finding none and leaving a mirror read before it."""
        with self._mirror_lock:
            if self._mirror is not None or not self.has_state():
                return
            ids = self.user_ids()
            self._mirror, self._mirror_ids = self._load_from_db(ids.tolist()), ids

    def _mirror_rows(self, user_ids: Sequence[int]) -> torch.Tensor | None:
        """The mirror's rows of ``user_ids``, or None when some user is not in it."""
        ids = np.asarray(user_ids, dtype=np.int64).reshape(-1)
        if len(self._mirror_ids) == 0:
            return None
        pos = np.minimum(np.searchsorted(self._mirror_ids, ids), len(self._mirror_ids) - 1)
        if not np.array_equal(self._mirror_ids[pos], ids):
            return None
        return torch.from_numpy(pos)

    def _load_from_db(self, user_ids: Sequence[int]) -> PrivateState:
        found: dict[int, tuple[bytes, int]] = {}
        with self._session() as s:
            for chunk in _chunks(user_ids):
                q = select(UserRow.user_id, UserRow.state, UserRow.step).where(
                    UserRow.user_id.in_(chunk)
                )
                for uid, blob, step in s.execute(q):
                    if blob is None:
                        raise StoreError(f"user {uid} has no private state yet")
                    found[uid] = (blob, step)
        missing = [int(u) for u in user_ids if int(u) not in found]
        if missing:
            raise StoreError(f"users not in this store: {missing[:10]}")
        return decode_private(
            [found[int(u)][0] for u in user_ids], [found[int(u)][1] for u in user_ids]
        )

    def save_states(
        self,
        user_ids: Sequence[int],
        state: PrivateState,
        round_id: int | None,
        attempt: int | None,
        meta: Mapping[str, str | int | None] | None = None,
    ) -> None:
        """Commit the new state of ``user_ids`` (rows of ``state`` in that order) and mark them
        trained in (round, attempt), all in one transaction; with ``meta``, those meta values
        are set (None: deleted) in the same transaction (:meth:`set_meta`)."""
        blobs = encode_private_rows(state, len(user_ids))
        rows = [
            {
                "user_id": int(u),
                "state": blobs[i],
                "step": int(state.step[i]),
                "last_round": round_id,
                "last_attempt": attempt,
            }
            for i, u in enumerate(user_ids)
        ]
        if not rows and not meta:
            return
        with self._meta_lock:
            with self._session.begin() as s:
                if rows:
                    s.execute(update(UserRow), rows)  # ORM bulk UPDATE by primary key
                if meta:
                    _write_meta(s, meta)
            if meta:
                self._mirror_meta(meta)
        if rows:
            self._mirror_saved(user_ids, state)
            with self._progress_lock:
                if self._progress is not None:
                    for u in user_ids:
                        self._progress[int(u)] = Progress(round_id, attempt)

    def _mirror_saved(self, user_ids: Sequence[int], state: PrivateState) -> None:
        """Write committed states into the mirror (dropped, to be rebuilt, if it lacks a user)."""
        with self._mirror_lock:
            if self._mirror is None:
                return
            rows = self._mirror_rows(user_ids)
            if rows is None:
                self._mirror = None
                return
            n = len(rows)
            with torch.no_grad():
                self._mirror.assign(
                    rows, state if len(state.step) == n else state.select(slice(0, n))
                )

    def progress(self, user_ids: Sequence[int]) -> dict[int, Progress]:
        """Committed (round, attempt) of ``user_ids``. A mirroring store answers from memory
        (read from the file once, then updated by each committed save: they all go through
        :meth:`save_states`), falling back to the file for a user it does not hold."""
        if self._mirroring:
            with self._progress_lock:
                if self._progress is None:
                    self._progress = self._read_progress(None)
                held = self._progress
                if all(int(u) in held for u in user_ids):
                    return {int(u): held[int(u)] for u in user_ids}
        return self._read_progress(user_ids)

    def _read_progress(self, user_ids: Sequence[int] | None) -> dict[int, Progress]:
        """(round, attempt) of ``user_ids`` (None: every user) as the file holds them."""
        cols = select(UserRow.user_id, UserRow.last_round, UserRow.last_attempt)
        with self._session() as s:
            if user_ids is None:
                return {uid: Progress(r, a) for uid, r, a in s.execute(cols)}
            out: dict[int, Progress] = {}
            for chunk in _chunks(user_ids):
                for uid, r, a in s.execute(cols.where(UserRow.user_id.in_(chunk))):
                    out[uid] = Progress(r, a)
        return out


def model_key(cfg: ModelConfig, seed: int) -> str:
    """What the private states were initialised for (a run's model shape and seed)."""
    return f"{cfg.kind}:{cfg.n_items}:{cfg.factor}:{cfg.layers}:seed={seed}"
