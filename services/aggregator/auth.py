"""Credentials: who a bearer token is (operator, reader or the clients it holds) and client
registration by shard enrolment tokens (services/enrolment.py). Client tokens are stored as
sha256 hashes only; enrolment tokens are never stored (derived again from the secret)."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError

from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, Malformed, NotFound, Unauthorized
from services.aggregator.events import RedisBus
from services.aggregator.repository import RELEASED, Repository
from services.aggregator.settings import Settings
from services.enrolment import Shard, verify_enrolment_token

log = logging.getLogger(__name__)

# Known token hashes kept in memory before the cache is emptied (it is refilled on demand).
_TOKEN_CACHE_SIZE = 4096
# Seconds a cached token is trusted. A release or registration on this replica empties its
# cache at once, and with Redis every other replica's too (services/aggregator/events.py);
# without Redis (or while it does not answer) the others forget within this time.
_TOKEN_CACHE_TTL_S = 30.0


def hash_token(token: str) -> str:
    """The stored form of a credential: sha256 hex (tokens are random, 256 bits)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who is calling: the clients its credential holds, or the operator."""

    client_ids: frozenset[int]
    operator: bool = False


class Credentials:
    """Authenticates bearer tokens and registers clients under new ones.

    Locking: ``_lock`` guards ``_tokens`` (token hash -> client ids, expiry) and
    ``_generation`` only and is never held while the database is queried; two threads missing
    the same token both query it, which is harmless (a token loses clients only to the
    operator's release, and gains some only by registering with it: either empties the cache
    of every replica, :meth:`forget_all`). A lookup that started before the cache was emptied
    is not cached: it may have read the credentials from before the change.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        population: int | None = None,
        bus: RedisBus | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.bus = bus  # with Redis, changes are announced to the other replicas
        # client ids are 0 .. population - 1; None: registration is refused (no_population)
        self.population = population if population is not None else settings.population
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[frozenset[int], float]] = {}
        self._generation = 0  # how often the cache was emptied

    def authenticate(self, token: str | None) -> Caller:
        """The caller behind a bearer token (401 when missing or unknown)."""
        known = self.known(token)
        if known is not None:
            return known
        assert token is not None
        h = hash_token(token)
        with self._lock:
            generation = self._generation
        with self.db.read() as s:
            ids = Repository(s).clients_of_token(h)
        if not ids:
            raise Unauthorized("unknown token")
        cached = frozenset(ids)
        with self._lock:
            if len(self._tokens) > _TOKEN_CACHE_SIZE:
                self._tokens.clear()
            if generation == self._generation:  # else it may be from before a change
                self._tokens[h] = (cached, time.monotonic() + _TOKEN_CACHE_TTL_S)
        return Caller(cached)

    def forget_all(self) -> None:
        """Empty the cache of credentials (they changed, here or on another replica)."""
        with self._lock:
            self._tokens.clear()
            self._generation += 1

    def _changed(self) -> None:
        """Credentials changed here: forget the cached ones, and tell the other replicas."""
        self.forget_all()
        if self.bus is not None:
            self.bus.publish_credentials_changed()

    def known(self, token: str | None) -> Caller | None:
        """:meth:`authenticate` without the database: the caller when the token is the
        operator's, the reader's or in the cache, None when only the database can tell (401
        when there is no token). Never blocks, so an event loop may call it."""
        if not token:
            raise Unauthorized("missing bearer token")
        if secrets.compare_digest(token.encode(), self.settings.operator_token.encode()):
            return Caller(frozenset(), operator=True)
        reader = self.settings.reader_token
        if reader and secrets.compare_digest(token.encode(), reader.encode()):
            return Caller(frozenset())  # may read rounds and models, owns no client
        with self._lock:
            hit = self._tokens.get(hash_token(token))
        if hit is not None and hit[1] > time.monotonic():
            return Caller(hit[0])
        return None

    def require_operator(self, token: str | None) -> None:
        """401 unless the token is the operator token."""
        if not token or not secrets.compare_digest(
            token.encode(), self.settings.operator_token.encode()
        ):
            raise Unauthorized("operator token required")

    def count_clients(self) -> int:
        """How many clients are registered."""
        with self.db.read() as s:
            return Repository(s).count_clients()

    def enrolment(self, token: str | None) -> Shard:
        """The shard an enrolment token enrols (401 when missing, invalid or when this
        aggregator has no enrolment secret)."""
        if not token:
            raise Unauthorized(
                "registration needs a shard enrolment token (Authorization: Bearer enrol-v1...)"
            )
        secret = self.settings.enrolment_secret
        if not secret:
            raise Unauthorized("this aggregator has no enrolment secret; registration is closed")
        shard = verify_enrolment_token(secret, token)
        if shard is None:
            raise Unauthorized("invalid enrolment token")
        return shard

    def register_clients(
        self, shard: Shard, client_ids: list[int], token: str | None = None
    ) -> tuple[str, list[int]]:
        """Register clients of ``shard`` under one credential; returns (token, ids).

        Every id must be in the population and in the shard, and held by no credential but
        the one of ``token`` (409 ``clients_held`` naming the others, nothing stored): a shard
        token registers new ids and ids the operator released, never ids another credential
        holds. ``token``: the client token the registrant chose (else a new one is made); ids
        it holds already are accepted again (a worker that lost the answer asks again).
        """
        limit = self.settings.max_register_per_request
        if len(client_ids) > limit:
            raise Malformed(
                f"{len(client_ids)} client ids in one request; at most {limit}",
                "too_many_clients",
            )
        population = self.population
        if population is None:
            raise Conflict(
                "the aggregator declares no population (FEDREC_AGG_POPULATION)", "no_population"
            )
        for c in client_ids:
            if not 0 <= c < population or not shard.owns(c):
                raise Forbidden(
                    f"client {c} is not in shard {shard.shard} of {shard.shards} of the "
                    f"population 0..{population - 1}",
                    "not_your_ids",
                )
        label = f"{shard.shard}/{shard.shards}"
        chosen = token is not None
        if token is None:
            token = secrets.token_urlsafe(32)
        elif self._is_service_token(token):
            raise Conflict("the chosen token is another credential's", "token_in_use")
        h = hash_token(token)
        held_before: dict[int, tuple[str, str | None]] = {}
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                existing = repo.existing_clients(client_ids)
                held = sorted(c for c, (by, _) in existing.items() if by not in (h, RELEASED))
                if held:
                    raise Conflict(_held_detail(held), "clients_held")
                if chosen:  # a credential holds clients of one shard only
                    held_before = other = repo.existing_clients(repo.clients_of_token(h))
                    if any(label != enrolled for _, enrolled in other.values()):
                        raise Conflict(
                            "the chosen token holds clients of another shard", "token_in_use"
                        )
                released = sorted(c for c, (by, _) in existing.items() if by == RELEASED)
                if repo.move_clients(released, h, RELEASED, label) != len(released):
                    raise Conflict(_MEANWHILE, "clients_held")
                repo.add_clients([c for c in client_ids if c not in existing], h, label)
        except IntegrityError:
            raise Conflict(_MEANWHILE, "clients_held") from None
        if held_before:  # a token that replicas may have cached holds more clients now
            self._changed()
        log.info(
            "shard %s registered %d clients (%d again, %d released before)",
            label,
            len(client_ids),
            sum(by == h for by, _ in existing.values()),
            len(released),
        )
        return token, client_ids

    def release_clients(self, client_ids: list[int]) -> list[int]:
        """The operator's release: ``client_ids`` stay registered (and in cohorts) but no
        credential holds them any more, until an enrolment token of their shard registers
        them again (a worker that lost its store). 404 ``not_registered`` naming ids that
        are not registered (nothing released)."""
        limit = self.settings.max_register_per_request
        if len(client_ids) > limit:
            raise Malformed(
                f"{len(client_ids)} client ids in one request; at most {limit}",
                "too_many_clients",
            )
        population = self.population or 0
        outside = [c for c in client_ids if not 0 <= c < population]  # never registered
        inside = [c for c in client_ids if 0 <= c < population]
        with self.db.transaction() as s:
            repo = Repository(s)
            unknown = sorted({*outside, *(set(inside) - set(repo.existing_clients(inside)))})
            if unknown:
                raise NotFound(
                    f"{len(unknown)} client ids are not registered: {_named(unknown)}",
                    "not_registered",
                )
            repo.move_clients(client_ids, RELEASED)
        self._changed()  # the tokens that held them no longer do, on any replica
        log.warning("the operator released %d clients", len(client_ids))
        return client_ids

    def _is_service_token(self, token: str) -> bool:
        """Whether ``token`` is the operator's or the reader's."""
        for known in (self.settings.operator_token, self.settings.reader_token):
            if known and secrets.compare_digest(token.encode(), known.encode()):
                return True
        return False


#: client ids named in a refusal's detail (the count names the rest)
_NAMED_IDS = 100


def _named(ids: list[int]) -> str:
    """``ids`` as a refusal names them: all of them, or the first hundred and a count."""
    shown = ", ".join(map(str, ids[:_NAMED_IDS]))
    return shown + (f" and {len(ids) - _NAMED_IDS} more" if len(ids) > _NAMED_IDS else "")


_MEANWHILE = (
    "another registration took some of these client ids while this one was checked: ask "
    "again to see which"
)


def _held_detail(ids: list[int]) -> str:
    """The detail of a ``clients_held`` refusal."""
    return (
        f"{len(ids)} client ids are held by another credential: {_named(ids)}. Only "
        "the token holding them registers them again; the operator may release them "
        "(POST /v1/clients/release) for a worker that lost its client token"
    )
