"""Shard enrolment tokens: the credential a worker registers its clients with.

The aggregator holds one enrolment secret and never stores tokens: a token names its shard and
is checked by deriving it again. A worker serving shard ``shard`` of ``shards`` holds

    ``enrol-v1.<shard>.<shards>.<hex>``  with
    ``<hex> = hmac_sha256(secret, f"fedrec-enrol-v1:{shard}/{shards}").hexdigest()``

and may register exactly the client ids ``i`` with ``i % shards == shard`` (docs/API.md).
The launcher, the compose secrets init and ``fedrec enrolment-token`` issue tokens with
:func:`enrolment_token`; the aggregator checks them with :func:`verify_enrolment_token`;
a worker reads its own shard from its token with :func:`parse_enrolment_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

PREFIX = "enrol-v1"
#: the most shards a token may name (a population is split among at most this many workers)
MAX_SHARDS = 1_000_000

# Canonical decimal numbers only (no sign, no leading zero, at most 7 digits): one shard has
# exactly one token text.
_TOKEN = re.compile(r"enrol-v1\.(0|[1-9][0-9]{0,6})\.([1-9][0-9]{0,6})\.([0-9a-f]{64})")


class EnrolmentTokenError(ValueError):
    """A token that is not an enrolment token, or an invalid shard/shards pair."""


@dataclass(frozen=True)
class Shard:
    """The part of the population a token enrols: ids ``i`` with ``i % shards == shard``."""

    shard: int
    shards: int

    def owns(self, client_id: int) -> bool:
        """Whether ``client_id`` belongs to this shard."""
        return client_id % self.shards == self.shard


def _check_shard(shard: int, shards: int) -> None:
    if isinstance(shard, bool) or isinstance(shards, bool):
        raise EnrolmentTokenError("shard and shards must be integers")
    if not 1 <= shards <= MAX_SHARDS:
        raise EnrolmentTokenError(f"shards must be between 1 and {MAX_SHARDS}, got {shards}")
    if not 0 <= shard < shards:
        raise EnrolmentTokenError(f"shard must be between 0 and {shards - 1}, got {shard}")


def _digest(secret: str, shard: int, shards: int) -> str:
    message = f"fedrec-enrol-v1:{shard}/{shards}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def enrolment_token(secret: str, shard: int, shards: int) -> str:
    """The enrolment token of shard ``shard`` of ``shards`` under ``secret``."""
    if not secret:
        raise EnrolmentTokenError("the enrolment secret must not be empty")
    _check_shard(shard, shards)
    return f"{PREFIX}.{shard}.{shards}.{_digest(secret, shard, shards)}"


def parse_enrolment_token(token: str) -> Shard:
    """The shard a token names, without checking its signature (a worker reads its own token
    with this). :class:`EnrolmentTokenError` when the text is not an enrolment token."""
    match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        raise EnrolmentTokenError(
            "not an enrolment token (expected enrol-v1.<shard>.<shards>.<64 hex digits>)"
        )
    shard, shards = int(match.group(1)), int(match.group(2))
    _check_shard(shard, shards)
    return Shard(shard, shards)


def verify_enrolment_token(secret: str, token: str) -> Shard | None:
    """The shard of ``token`` when it was issued under ``secret``, else None (constant-time
    comparison of the signature)."""
    if not secret:
        return None
    try:
        shard = parse_enrolment_token(token)
    except EnrolmentTokenError:
        return None
    expected = enrolment_token(secret, shard.shard, shard.shards)
    if not hmac.compare_digest(expected.encode(), token.encode()):
        return None
    return shard
