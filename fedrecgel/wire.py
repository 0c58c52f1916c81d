"""The wire codec: model versions and client updates as safetensors (never pickle).

Model:   one safetensors blob, tensors = the shared parameters by canonical name, metadata
         ``format=fedrecgel-model``, ``version``, and the model shape.
Updates: one safetensors blob carrying one or more clients' updates of the same round.
         Tensor keys ``{i}/{table}.rows`` (int64 row indices, sorted, unique),
         ``{i}/{table}.values`` (float32 (U, d)), ``{i}/{name}`` (dense float32 gradient);
         metadata ``format=fedrecgel-updates``, ``round``, and ``updates``: a JSON list of
         ``{"client_id", "n_samples", "loss"}``. Nothing else can be carried: there is no
         field for user embeddings, optimizer state or interactions.

:func:`decode_updates` validates everything a server must check before aggregating (keys,
dtypes, shapes, finite values, row indices in range) and raises :class:`WireError` with a
message that says what is wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import save as _st_save
from safetensors.torch import load as st_load
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.uploads import PartialSum, Update


def st_save(tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """``safetensors.torch.save`` with a canonical header: the same tensors and metadata give
    the same bytes in every process (safetensors writes the metadata in a per-process random
    order, which would change a model's sha256 and ETag on every restart). The tensors go
    through ``safetensors.numpy`` (the same file, without the per-tensor overhead of its torch
    front end; views and tensors sharing a buffer need no copies of their own). The data
    section is copied once, into the result (a model version's is megabytes)."""
    arrays = {k: np.ascontiguousarray(v.detach().numpy()) for k, v in tensors.items()}
    data = _st_save(arrays, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section stays 8-byte aligned
    if len(text) == n and data[8 : 8 + n] == text:
        return data  # already canonical
    return b"".join((len(text).to_bytes(8, "little"), text, memoryview(data)[8 + n :]))


MODEL_FORMAT = "fedrecgel-model"
UPDATES_FORMAT = "fedrecgel-updates"
PARTIAL_FORMAT = "fedrecgel-partial"


class WireError(ValueError):
    """A body that cannot be accepted; ``str(err)`` says why."""


#: the largest round number a body may name (the aggregator's columns are 32-bit)
MAX_ROUND = 2**31 - 1
_ROUND = re.compile(r"0|[1-9][0-9]{0,9}")


def load_json(text: str | bytes, what: str) -> Any:
    """Parse JSON sent by a peer: :class:`WireError` on anything that is not JSON (bytes that
    are not UTF-8 included), also on nesting too deep for the parser (never a RecursionError).
    Every parser of a peer's JSON goes through here, so that none forgets a case."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise WireError(f"{what} is not valid JSON ({reason})") from None


def _round_of(meta: dict[str, str]) -> int:
    """The ``round`` metadata: a plain decimal integer in 0..MAX_ROUND."""
    text = meta.get("round")
    if not isinstance(text, str) or not _ROUND.fullmatch(text) or int(text) > MAX_ROUND:
        shown = repr(text)[:40]
        raise WireError(f"round must be a decimal integer in 0..{MAX_ROUND}, got {shown}")
    return int(text)


def _json_int(value: object, what: str) -> int:
    """An integer field of the metadata: a JSON integer (never a boolean, a fraction or a
    string, which a lenient reading would turn into some other client or count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an integer, got {repr(value)[:40]}")
    return value


def _json_float(value: object, what: str) -> float:
    """A number field of the metadata (a JSON integer or fraction, within the float range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{what} must be a number, got {repr(value)[:40]}")
    try:
        return float(value)
    except OverflowError:
        raise WireError(f"{what} is beyond the float range") from None


@dataclass(frozen=True)
class DecodedUpdates:
    """A decoded upload body: its round and its updates, each with a content digest."""

    round_id: int
    updates: list[Update]
    digests: list[str]


def config_metadata(cfg: ModelConfig) -> dict[str, str]:
    """The model shape as safetensors metadata."""
    return {
        "kind": cfg.kind,
        "n_items": str(cfg.n_items),
        "factor": str(cfg.factor),
        "layers": str(cfg.layers),
    }


def config_from_metadata(meta: dict[str, str]) -> ModelConfig:
    """Inverse of :func:`config_metadata`."""
    kind = meta.get("kind", "ncf")
    if kind not in ("ncf", "mf"):
        raise WireError(f"unknown model kind {kind!r}")
    return ModelConfig(
        n_items=int(meta["n_items"]),
        kind=kind,  # type: ignore[arg-type]
        factor=int(meta["factor"]),
        layers=int(meta["layers"]),
    )


def encode_model(cfg: ModelConfig, shared: dict[str, Tensor], version: int) -> bytes:
    """Serialize a model version's shared parameters."""
    meta = {"format": MODEL_FORMAT, "version": str(version), **config_metadata(cfg)}
    tensors = {k: shared[k].detach().contiguous() for k in cfg.shared_shapes()}
    return st_save(tensors, metadata=meta)


#: the largest safetensors header (tensor names, shapes, metadata) read from a peer: parsing
#: one costs far more than its size (a 64 MB header of empty JSON lists took 2.5 GB and 28 s
#: of CPU before it was refused); a worker splits its uploads to stay below it
#: (``services.client_sim.aggregator_client``), a partial sum of 180,000 clients fits
MAX_HEADER_BYTES = 8 * 1024 * 1024


def header_length(data: bytes, limit: int | None = None) -> int:
    """The header length of a safetensors blob; WireError unless it is within the blob and at
    most ``limit`` bytes (default :data:`MAX_HEADER_BYTES`; checked before any of it is
    parsed)."""
    limit = MAX_HEADER_BYTES if limit is None else limit
    if len(data) < 8:
        raise WireError("body is not a safetensors blob (too short)")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        raise WireError("body is not a safetensors blob (bad header length)")
    if n > limit:
        raise WireError(
            f"safetensors header of {n} bytes is over the limit of {limit} (too many updates "
            "or clients in one body: split it)"
        )
    return n


def _read(data: bytes) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Parse a safetensors blob into tensors and metadata (WireError on garbage)."""
    header_len = header_length(data)
    try:
        header = json.loads(data[8 : 8 + header_len])
        tensors = st_load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError, RecursionError) as err:
        raise WireError(f"body is not a valid safetensors blob: {err}") from None
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise WireError("safetensors metadata must be a string map")
    return tensors, meta


def decode_model(data: bytes) -> tuple[ModelConfig, dict[str, Tensor], int]:
    """Parse a model blob: (config, shared parameters, version)."""
    tensors, meta = _read(data)
    if meta.get("format") != MODEL_FORMAT:
        raise WireError(f"not a model blob (format={meta.get('format')!r})")
    try:
        cfg = config_from_metadata(meta)
        version = int(meta["version"])
    except (KeyError, ValueError) as err:
        raise WireError(f"bad model metadata: {err}") from None
    shapes = cfg.shared_shapes()
    if set(tensors) != set(shapes):
        raise WireError("model tensors do not match its declared shape")
    for k, shape in shapes.items():
        if tuple(tensors[k].shape) != shape:
            raise WireError(f"model tensor {k} has shape {tuple(tensors[k].shape)}, want {shape}")
    return cfg, tensors, version


def update_digest(round_id: int, u: Update) -> str:
    """Content digest of one update (for idempotent retries): sha256 over its canonical bytes,
    its sample count and loss included."""
    return _digest(f"{round_id}:{u.client_id}:{u.n_samples}:{float(u.loss)!r}", u)


def _digest(head: str, u: Update | PartialSum) -> str:
    """sha256 over ``head`` and an upload's tensors (item rows, then dense, each by name)."""
    h = hashlib.sha256()
    h.update(head.encode())
    for name in sorted(u.rows):
        idx, vals = u.rows[name]
        h.update(name.encode())
        h.update(idx.to(torch.int64).contiguous().numpy().data)
        h.update(vals.to(torch.float32).contiguous().numpy().data)
    for name in sorted(u.dense):
        h.update(name.encode())
        h.update(u.dense[name].to(torch.float32).contiguous().numpy().data)
    return h.hexdigest()


def encode_updates(round_id: int, updates: list[Update]) -> bytes:
    """Serialize several clients' updates of one round into one body."""
    tensors: dict[str, Tensor] = {}
    info = []
    for i, u in enumerate(updates):
        _put(tensors, f"{i}/", u)
        info.append({"client_id": u.client_id, "n_samples": u.n_samples, "loss": u.loss})
    meta = {"format": UPDATES_FORMAT, "round": str(round_id), "updates": json.dumps(info)}
    return st_save(tensors, metadata=meta)


def _put(tensors: dict[str, Tensor], prefix: str, u: Update | PartialSum) -> None:
    """An upload's tensors under ``prefix``: ``{table}.rows``, ``{table}.values``, ``{name}``."""
    for name, (idx, vals) in u.rows.items():
        # uploads are views of their group's gradients (tables of one update share one
        # index tensor, clients share buffers); safetensors wants tensors of their own
        tensors[f"{prefix}{name}.rows"] = idx.to(torch.int64)
        tensors[f"{prefix}{name}.values"] = vals.to(torch.float32)
    for name, g in u.dense.items():
        tensors[f"{prefix}{name}"] = g.to(torch.float32)


def _check_float(key: str, t: Tensor, shape: tuple[int, ...], finite: bool = True) -> None:
    if t.dtype != torch.float32:
        raise WireError(f"{key}: dtype {t.dtype} is not float32")
    if tuple(t.shape) != shape:
        raise WireError(f"{key}: shape {tuple(t.shape)} does not match {shape}")
    if finite and not bool(torch.isfinite(t).all()):
        raise WireError(f"{key}: contains NaN or Inf")


def _check_finite(tensors: dict[str, Tensor]) -> None:
    """Every tensor finite, checked in one pass over all of them (many small tensors cost
    far more one by one); the message names the first one that is not."""
    if not tensors or bool(
        torch.isfinite(torch.cat([t.reshape(-1) for t in tensors.values()])).all()
    ):
        return
    for key, t in tensors.items():
        _check_float(key, t, tuple(t.shape))


def _item_rows(
    tensors: dict[str, Tensor],
    table: str,
    prefix: str,
    where: str,
    n_items: int,
    shapes: dict[str, tuple[int, ...]],
) -> tuple[Tensor, Tensor]:
    """The checked (row indices, values) of item table ``table`` under the key ``prefix``
    (an upload's or a partial sum's): 1-d int64 indices in [0, n_items), sorted and unique,
    values of shape (rows, width), floating (finiteness is checked over the whole body)."""
    rk, vk = f"{prefix}{table}.rows", f"{prefix}{table}.values"
    if rk not in tensors or vk not in tensors:
        raise WireError(f"{where}missing {table} rows")
    idx, vals = tensors[rk], tensors[vk]
    if idx.dtype != torch.int64 or idx.dim() != 1:
        raise WireError(f"{rk}: must be a 1-d int64 tensor")
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n_items):
        raise WireError(f"{rk}: row index out of range [0, {n_items})")
    if len(idx) > 1 and not bool((idx[1:] > idx[:-1]).all()):
        raise WireError(f"{rk}: row indices must be sorted and unique")
    _check_float(vk, vals, (len(idx), shapes[table][1]), finite=False)
    return idx, vals


def _shared_part(
    tensors: dict[str, Tensor],
    cfg: ModelConfig,
    prefix: str,
    where: str,
    floats: dict[str, Tensor],
    keys: set[str],
) -> tuple[dict[str, tuple[Tensor, Tensor]], dict[str, Tensor]]:
    """The checked item rows and dense gradients of an upload under ``prefix`` (finiteness
    is checked over ``floats``, where its float tensors go; ``keys`` takes its keys)."""
    shapes = cfg.shared_shapes()
    rows: dict[str, tuple[Tensor, Tensor]] = {}
    for t in cfg.item_tables():
        rows[t] = _item_rows(tensors, t, prefix, where, cfg.n_items, shapes)
        floats[f"{prefix}{t}.values"] = rows[t][1]
        keys |= {f"{prefix}{t}.rows", f"{prefix}{t}.values"}
    dense: dict[str, Tensor] = {}
    for name in cfg.dense_names():
        key = f"{prefix}{name}"
        if key not in tensors:
            raise WireError(f"{where}missing dense gradient {name}")
        _check_float(key, tensors[key], shapes[name], finite=False)
        floats[key] = dense[name] = tensors[key]
        keys.add(key)
    return rows, dense


def decode_updates(data: bytes, cfg: ModelConfig) -> DecodedUpdates:
    """Parse and validate an upload body against the model shape ``cfg``."""
    tensors, meta = _read(data)
    if meta.get("format") != UPDATES_FORMAT:
        raise WireError(f"not an updates blob (format={meta.get('format')!r})")
    round_id = _round_of(meta)
    if "updates" not in meta:
        raise WireError("bad updates metadata: no 'updates' list")
    info = load_json(meta["updates"], "the 'updates' metadata")
    if not isinstance(info, list) or not info:
        raise WireError("updates metadata must list at least one update")
    extra_meta = set(meta) - {"format", "round", "updates"}
    if extra_meta:
        raise WireError(f"unexpected metadata keys: {sorted(extra_meta)}")
    expected_keys: set[str] = set()
    updates: list[Update] = []
    seen_clients: set[int] = set()
    floats: dict[str, Tensor] = {}
    for i, entry in enumerate(info):
        if not isinstance(entry, dict):
            raise WireError(f"update {i}: metadata entry must be an object")
        extra_fields = set(entry) - {"client_id", "n_samples", "loss"}
        if extra_fields:
            raise WireError(f"update {i}: unexpected fields {sorted(extra_fields)}")
        if "client_id" not in entry or "n_samples" not in entry:
            raise WireError(f"update {i}: bad metadata entry (needs client_id and n_samples)")
        client_id = _json_int(entry["client_id"], f"update {i}: client_id")
        n_samples = _json_int(entry["n_samples"], f"update {i}: n_samples")
        loss = _json_float(entry.get("loss", 0.0), f"update {i}: loss")
        if n_samples <= 0:
            raise WireError(f"update {i}: n_samples must be positive")
        if client_id in seen_clients:
            raise WireError(f"update {i}: client {client_id} appears twice in one body")
        seen_clients.add(client_id)
        where = f"update {i}: "
        rows, dense = _shared_part(tensors, cfg, f"{i}/", where, floats, expected_keys)
        updates.append(Update(client_id, n_samples, rows, dense, loss))
    extra = set(tensors) - expected_keys
    if extra:
        raise WireError(f"unexpected tensors in body: {sorted(extra)[:5]}")
    _check_finite(floats)
    return DecodedUpdates(round_id, updates, [update_digest(round_id, u) for u in updates])


def body_format(data: bytes) -> str | None:
    """The ``format`` metadata of a safetensors body (None when it has none or is no such
    blob): tells a partial sum from per-client updates before decoding either. WireError
    when its header is over :data:`MAX_HEADER_BYTES` (not parsed)."""
    if len(data) < 8:
        return None
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        return None
    header_length(data)
    try:
        header = load_json(data[8 : 8 + n], "the header")
    except WireError:
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    return fmt if isinstance(fmt, str) else None


def partial_digest(round_id: int, p: PartialSum) -> str:
    """Content digest of one partial sum (idempotent retries): sha256 over its canonical
    bytes, the clients it covers and their sample counts included."""
    clients = f"{json.dumps(p.client_ids)}:{json.dumps(p.n_samples)}"
    return _digest(f"{round_id}:partial:{clients}{float(p.loss)!r}", p)


def encode_partial(round_id: int, p: PartialSum) -> bytes:
    """Serialize a worker's partial sum of one round. Tensor keys ``{table}.rows``,
    ``{table}.values``, ``{name}``; metadata ``format=fedrecgel-partial``, ``round``,
    ``clients`` (a JSON list of ``{"client_id", "n_samples"}``) and ``loss`` (their sum)."""
    tensors: dict[str, Tensor] = {}
    _put(tensors, "", p)
    clients = [
        {"client_id": c, "n_samples": n} for c, n in zip(p.client_ids, p.n_samples, strict=True)
    ]
    meta = {
        "format": PARTIAL_FORMAT,
        "round": str(round_id),
        "clients": json.dumps(clients),
        "loss": repr(float(p.loss)),
    }
    return st_save(tensors, metadata=meta)


@dataclass(frozen=True)
class DecodedPartial:
    """A decoded partial-sum body: its round, the partial sum and its content digest."""

    round_id: int
    partial: PartialSum
    digest: str


def decode_partial(data: bytes, cfg: ModelConfig) -> DecodedPartial:
    """Parse and validate a partial-sum body against the model shape ``cfg`` (keys, dtypes,
    shapes, finite values, row indices in range, sorted and unique; the clients listed once
    each, ascending, with positive sample counts; a finite loss)."""
    tensors, meta = _read(data)
    if meta.get("format") != PARTIAL_FORMAT:
        raise WireError(f"not a partial-sum blob (format={meta.get('format')!r})")
    extra_meta = set(meta) - {"format", "round", "clients", "loss"}
    if extra_meta:
        raise WireError(f"unexpected metadata keys: {sorted(extra_meta)}")
    round_id = _round_of(meta)
    if "clients" not in meta or "loss" not in meta:
        raise WireError("bad partial-sum metadata: needs 'clients' and 'loss'")
    info = load_json(meta["clients"], "the 'clients' metadata")
    try:
        loss = float(meta["loss"])
    except ValueError:
        raise WireError(f"bad partial-sum metadata: loss {meta['loss'][:40]!r}") from None
    if not isinstance(info, list) or not info:
        raise WireError("a partial sum must list at least one client")
    ids: list[int] = []
    sizes: list[int] = []
    for i, entry in enumerate(info):
        if not isinstance(entry, dict) or set(entry) != {"client_id", "n_samples"}:
            raise WireError(f"client entry {i}: must be {{client_id, n_samples}}")
        ids.append(_json_int(entry["client_id"], f"client entry {i}: client_id"))
        sizes.append(_json_int(entry["n_samples"], f"client entry {i}: n_samples"))
        if sizes[-1] <= 0:
            raise WireError(f"client entry {i}: n_samples must be positive")
    if any(b <= a for a, b in itertools.pairwise(ids)):
        raise WireError("the clients of a partial sum must be listed once each, ascending")
    if not math.isfinite(loss):
        raise WireError("loss must be finite")
    floats: dict[str, Tensor] = {}
    keys: set[str] = set()
    rows, dense = _shared_part(tensors, cfg, "", "", floats, keys)
    extra = set(tensors) - keys
    if extra:
        raise WireError(f"unexpected tensors in body: {sorted(extra)[:5]}")
    _check_finite(floats)
    p = PartialSum(tuple(ids), tuple(sizes), rows, dense, loss)
    return DecodedPartial(round_id, p, partial_digest(round_id, p))


def encode_state(state: dict[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Serialize a plain tensor dict (server optimizer state, private state in a store);
    tensors that share a buffer (views of one) need no copies: :func:`st_save`."""
    return st_save(state, metadata=metadata)


def decode_state(data: bytes) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Inverse of :func:`encode_state`."""
    return _read(data)
