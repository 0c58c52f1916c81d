"""The secure-aggregation messages as bytes: what a client sends to (and receives from) the
server in each step, for a transport to carry.

Keys, shares and reveals are canonical JSON (bytes as base64, client ids as decimal strings),
tagged ``"instance": "b"`` when they belong to the second protocol instance of a sparse round
(:mod:`fedrecgel.secagg.aggregate`; untagged: the first, or a dense round's only one);
the masked vector is a safetensors blob holding one tensor ``y`` of the round's words (uint64,
or uint32 / uint16 / uint8 in a narrower ring). Several clients' masked vectors travel in one
body as a batch (:func:`encode_masked_batch`: a magic, a count, then per client its id, the
length of its ``encode_masked`` bytes and those bytes). Every decoder
checks types, lengths and the declared kind, and raises :class:`MessageError` on anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from fedrecgel.fixedpoint import WORDS
from fedrecgel.secagg import shamir
from fedrecgel.secagg.protocol import Keys, Masked, Reveal, Shares
from fedrecgel.wire import WireError, header_length, load_json

FORMAT = "fedrecgel-secagg"
#: the protocol instances of a round: "a" (dense rounds' only one; sparse rounds' counts) and
#: "b" (sparse rounds' update)
INSTANCES = ("a", "b")
#: the word types a masked vector may hold (:data:`fedrecgel.fixedpoint.WORDS`)
WORD_TYPES = {np.dtype(u) for u, _ in WORDS.values()}


class MessageError(ValueError):
    """A body that is not a well-formed secure-aggregation message."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: Any, length: int | None = None) -> bytes:
    if not isinstance(s, str):
        raise MessageError("expected a base64 string")
    try:
        b = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError("bad base64") from None
    if length is not None and len(b) != length:
        raise MessageError(f"expected {length} bytes, got {len(b)}")
    return b


def _dump(kind: str, body: dict[str, Any], instance: str = "a") -> bytes:
    if instance not in INSTANCES:
        raise MessageError(f"no protocol instance {instance!r}")
    tag = {} if instance == "a" else {"instance": instance}  # instance A's bytes as before
    return json.dumps({"format": FORMAT, "kind": kind, **body, **tag}, sort_keys=True).encode()


def instance_of(doc: Any) -> str:
    """The protocol instance a keys, shares or reveal document (parsed JSON) belongs to."""
    got = doc.get("instance", "a") if isinstance(doc, dict) else "a"
    if got not in INSTANCES:
        raise MessageError(f"instance must be one of {list(INSTANCES)}")
    return str(got)


def _load(data: bytes, kind: str) -> dict[str, Any]:
    try:
        doc = load_json(data, "the message")
    except WireError:
        raise MessageError("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("kind") != kind:
        raise MessageError(f"not a {kind} message")
    return doc


def _cid(s: Any) -> int:
    try:
        v = int(s)
    except (TypeError, ValueError, OverflowError):  # 1e400 reads as infinity
        raise MessageError(f"bad client id {s!r}") from None
    if v < 0 or str(v) != str(s).strip():
        raise MessageError(f"bad client id {s!r}")
    return v


def _map(doc: dict[str, Any], key: str) -> dict[str, Any]:
    m = doc.get(key)
    if not isinstance(m, dict):
        raise MessageError(f"{key} must be an object")
    return m


def encode_keys(m: Keys, instance: str = "a") -> bytes:
    """Step 0 body (of protocol instance ``instance``)."""
    body = {"client_id": m.client_id, "c_pk": _b64(m.c_pk), "s_pk": _b64(m.s_pk)}
    return _dump("keys", body, instance)


def decode_keys(data: bytes) -> Keys:
    """Inverse of :func:`encode_keys`."""
    d = _load(data, "keys")
    return Keys(_cid(d.get("client_id")), _unb64(d.get("c_pk"), 32), _unb64(d.get("s_pk"), 32))


def encode_shares(m: Shares, instance: str = "a") -> bytes:
    """Step 1 body (of protocol instance ``instance``)."""
    return _dump(
        "shares",
        {
            "client_id": m.client_id,
            "sealed": {str(v): _b64(c) for v, c in m.sealed.items()},
            "commits": {str(v): [_b64(a), _b64(b)] for v, (a, b) in m.share_commits.items()},
            "b_commit": _b64(m.b_commit),
        },
        instance,
    )


def decode_shares(data: bytes) -> Shares:
    """Inverse of :func:`encode_shares`."""
    d = _load(data, "shares")
    sealed = {_cid(v): _unb64(c) for v, c in _map(d, "sealed").items()}
    commits: dict[int, tuple[bytes, bytes]] = {}
    for v, pair in _map(d, "commits").items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise MessageError("a share commitment is a pair")
        commits[_cid(v)] = (_unb64(pair[0], 32), _unb64(pair[1], 32))
    return Shares(_cid(d.get("client_id")), sealed, commits, _unb64(d.get("b_commit"), 32))


def encode_masked(m: Masked) -> bytes:
    """Step 2 body."""
    meta = {
        "format": FORMAT,
        "kind": "masked",
        "client_id": str(m.client_id),
        "complaints": json.dumps(list(m.complaints)),
    }
    y = np.asarray(m.y)
    if y.dtype not in WORD_TYPES:
        raise MessageError(f"masked vector of {y.dtype}: not a ring word")
    return st_save({"y": np.ascontiguousarray(y)}, metadata=meta)


def decode_masked(
    data: bytes, length: int, word: type[np.unsignedinteger[Any]] = np.uint64
) -> Masked:
    """Inverse of :func:`encode_masked` (``length``: the round's vector length; ``word``: its
    ring's word type)."""
    try:
        n = header_length(data)
        tensors = st_load(data)
        meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
        complaints = json.loads(meta.get("complaints", "[]"))
    except WireError as err:
        raise MessageError(str(err)) from None
    except (SafetensorError, ValueError, UnicodeDecodeError, RecursionError):
        raise MessageError("not a safetensors blob") from None
    if meta.get("format") != FORMAT or meta.get("kind") != "masked" or set(tensors) != {"y"}:
        raise MessageError("not a masked-input message")
    y = tensors["y"]
    if y.dtype != word or y.shape != (length,):
        raise MessageError(f"masked vector must be {np.dtype(word).name} ({length},)")
    if not isinstance(complaints, list):
        raise MessageError("complaints must be a list")
    return Masked(_cid(meta.get("client_id")), y, tuple(_cid(c) for c in complaints))


#: the first bytes of a batch of masked inputs (a single ``encode_masked`` body starts with the
#: little-endian length of its safetensors header, never these bytes)
BATCH_MAGIC = b"FRSAMB01"
_U32, _U64 = 4, 8


def encode_masked_batch(items: list[tuple[int, bytes]]) -> bytes:
    """Several clients' ``encode_masked`` bodies in one: ``BATCH_MAGIC``, the count (uint32),
    then per client its id and the length of its body (uint64 each), and the body; all
    little-endian. ``items``: (client id, :func:`encode_masked` bytes), one per client."""
    if not items:
        raise MessageError("a batch of masked inputs is not empty")
    parts = [BATCH_MAGIC, len(items).to_bytes(_U32, "little")]
    for cid, body in items:
        parts += [cid.to_bytes(_U64, "little"), len(body).to_bytes(_U64, "little"), body]
    return b"".join(parts)


def is_masked_batch(data: bytes) -> bool:
    """Whether ``data`` is a batch (:func:`encode_masked_batch`), not one ``encode_masked``."""
    return data[: len(BATCH_MAGIC)] == BATCH_MAGIC


def split_masked_batch(data: bytes, most: int) -> list[tuple[int, bytes]]:
    """Inverse of :func:`encode_masked_batch`: each client's id and ``encode_masked`` bytes
    (not decoded yet), with at most ``most`` clients, each once, and nothing left over
    (:class:`MessageError` otherwise)."""
    if not is_masked_batch(data):
        raise MessageError("not a batch of masked inputs")
    at = len(BATCH_MAGIC)
    if len(data) < at + _U32:
        raise MessageError("a batch of masked inputs cut short")
    count = int.from_bytes(data[at : at + _U32], "little")
    at += _U32
    if not 1 <= count <= most:
        raise MessageError(f"{count} masked inputs in one body; 1 to {most} for this token")
    out: list[tuple[int, bytes]] = []
    for _ in range(count):
        if len(data) < at + 2 * _U64:
            raise MessageError("a batch of masked inputs cut short")
        cid = int.from_bytes(data[at : at + _U64], "little")
        n = int.from_bytes(data[at + _U64 : at + 2 * _U64], "little")
        at += 2 * _U64
        if len(data) < at + n:
            raise MessageError(f"client {cid}'s masked input cut short")
        out.append((cid, data[at : at + n]))
        at += n
    if at != len(data):
        raise MessageError(f"{len(data) - at} bytes after the last masked input of a batch")
    if len({c for c, _ in out}) != len(out):
        raise MessageError("one masked input per client in a batch")
    return out


def encode_reveal(m: Reveal, instance: str = "a") -> bytes:
    """Step 3 body (of protocol instance ``instance``)."""
    return _dump(
        "reveal",
        {
            "client_id": m.client_id,
            "b": {str(u): _b64(y) for u, y in m.b_shares.items()},
            "s": {str(v): _b64(y) for v, y in m.s_shares.items()},
        },
        instance,
    )


def decode_reveal(data: bytes) -> Reveal:
    """Inverse of :func:`encode_reveal`."""
    d = _load(data, "reveal")
    n = shamir.SHARE_BYTES
    return Reveal(
        _cid(d.get("client_id")),
        {_cid(u): _unb64(y, n) for u, y in _map(d, "b").items()},
        {_cid(v): _unb64(y, n) for v, y in _map(d, "s").items()},
    )
