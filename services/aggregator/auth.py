"""Credentials: who a bearer token is (operator, reader or the clients it holds) and client
registration. Tokens are stored as sha256 hashes only."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError

from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Unauthorized
from services.aggregator.repository import Repository
from services.aggregator.settings import Settings

log = logging.getLogger(__name__)

# Known token hashes kept in memory before the cache is emptied (it is refilled on demand).
_TOKEN_CACHE_SIZE = 4096


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

    Locking: ``_lock`` guards ``_tokens`` (token hash -> client ids) only and is never held
    while the database is queried; two threads missing the same token both query it, which is
    harmless (a token's clients never change once registered).
    """

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self._lock = threading.Lock()
        self._tokens: dict[str, frozenset[int]] = {}

    def authenticate(self, token: str | None) -> Caller:
        """The caller behind a bearer token (401 when missing or unknown)."""
        if not token:
            raise Unauthorized("missing bearer token")
        if secrets.compare_digest(token.encode(), self.settings.operator_token.encode()):
            return Caller(frozenset(), operator=True)
        reader = self.settings.reader_token
        if reader and secrets.compare_digest(token.encode(), reader.encode()):
            return Caller(frozenset())  # may read rounds and models, owns no client
        h = hash_token(token)
        with self._lock:
            cached = self._tokens.get(h)
        if cached is None:
            with self.db.transaction() as s:
                ids = Repository(s).clients_of_token(h)
            if not ids:
                raise Unauthorized("unknown token")
            cached = frozenset(ids)
            with self._lock:
                if len(self._tokens) > _TOKEN_CACHE_SIZE:
                    self._tokens.clear()
                self._tokens[h] = cached
        return Caller(cached)

    def require_operator(self, token: str | None) -> None:
        """401 unless the token is the operator token."""
        if not token or not secrets.compare_digest(
            token.encode(), self.settings.operator_token.encode()
        ):
            raise Unauthorized("operator token required")

    def count_clients(self) -> int:
        """How many clients are registered."""
        with self.db.transaction() as s:
            return Repository(s).count_clients()

    def register_clients(self, client_ids: list[int]) -> tuple[str, list[int]]:
        """Register clients under a new credential; returns (token, ids)."""
        token = secrets.token_urlsafe(32)
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                taken = repo.existing_clients(client_ids)
                if taken:
                    raise Conflict(
                        f"clients already registered: {taken[:10]}", "already_registered"
                    )
                repo.add_clients(client_ids, hash_token(token))
        except IntegrityError:
            raise Conflict("clients already registered", "already_registered") from None
        log.info("registered %d clients", len(client_ids))
        return token, client_ids
