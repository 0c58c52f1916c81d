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
from services.aggregator.errors import Conflict, Forbidden, Malformed, Unauthorized
from services.aggregator.repository import Repository
from services.aggregator.settings import Settings
from services.enrolment import Shard, verify_enrolment_token

log = logging.getLogger(__name__)

# Known token hashes kept in memory before the cache is emptied (it is refilled on demand).
_TOKEN_CACHE_SIZE = 4096
# Seconds a cached token is trusted: a re-registration on a replica replaces a token's hash,
# and this replica's cache forgets the old one within this time (its own re-registrations
# empty the cache at once).
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

    Locking: ``_lock`` guards ``_tokens`` (token hash -> client ids, expiry) only and is never
    held while the database is queried; two threads missing the same token both query it,
    which is harmless (a token only ever loses clients, to a re-registration, which empties
    the cache).
    """

    def __init__(self, db: Database, settings: Settings, population: int | None = None) -> None:
        self.db = db
        self.settings = settings
        # client ids are 0 .. population - 1; None: registration is refused (no_population)
        self.population = population if population is not None else settings.population
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[frozenset[int], float]] = {}

    def authenticate(self, token: str | None) -> Caller:
        """The caller behind a bearer token (401 when missing or unknown)."""
        known = self.known(token)
        if known is not None:
            return known
        assert token is not None
        h = hash_token(token)
        with self.db.read() as s:
            ids = Repository(s).clients_of_token(h)
        if not ids:
            raise Unauthorized("unknown token")
        cached = frozenset(ids)
        with self._lock:
            if len(self._tokens) > _TOKEN_CACHE_SIZE:
                self._tokens.clear()
            self._tokens[h] = (cached, time.monotonic() + _TOKEN_CACHE_TTL_S)
        return Caller(cached)

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

    def register_clients(self, shard: Shard, client_ids: list[int]) -> tuple[str, list[int]]:
        """Register clients of ``shard`` under a new credential; returns (token, ids).

        Every id must be in the population and in the shard; ids this shard registered before
        move to the new credential (a worker that lost its token registers again), ids any
        other credential holds are refused (409).
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
        token = secrets.token_urlsafe(32)
        h = hash_token(token)
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                existing = repo.existing_clients(client_ids)
                taken = sorted(c for c, by in existing.items() if by != label)
                if taken:
                    raise Conflict(
                        f"clients already registered by another credential: {taken[:10]}",
                        "already_registered",
                    )
                repo.rekey_clients(sorted(existing), h)
                repo.add_clients([c for c in client_ids if c not in existing], h, label)
        except IntegrityError:
            raise Conflict("clients already registered", "already_registered") from None
        if existing:
            with self._lock:
                self._tokens.clear()  # the old tokens of these clients no longer hold them
        log.info("shard %s registered %d clients (%d again)", label, len(client_ids), len(existing))
        return token, client_ids
