"""How the worker store encodes a user's rows: the private state (params and Adam moments) and
the local interactions, each a safetensors blob (:func:`fedrecgel.wire.encode_state`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from fedrecgel.data import Split
from fedrecgel.sam import PrivateState
from fedrecgel.wire import decode_state, encode_state

STATE_FORMAT = "fedrecgel-private-state"
DATA_FORMAT = "fedrecgel-user-data"


class StoreError(RuntimeError):
    """The store is inconsistent with what the worker expects."""


def encode_user_data(split: Split, u: int) -> bytes:
    """One user's local interactions of ``split`` as a safetensors blob."""
    tensors = {
        "train": torch.from_numpy(np.asarray(split.user_train(u), dtype=np.int64).copy()),
        "test": torch.tensor([int(split.test_items[u])], dtype=torch.int64),
        "test_negatives": torch.from_numpy(np.asarray(split.test_negatives[u], dtype=np.int64)),
    }
    if split.val_items is not None and split.val_negatives is not None:
        tensors["val"] = torch.tensor([int(split.val_items[u])], dtype=torch.int64)
        tensors["val_negatives"] = torch.from_numpy(
            np.asarray(split.val_negatives[u], dtype=np.int64)
        )
    return encode_state(tensors, {"format": DATA_FORMAT})


def encode_private(state: PrivateState, row: int) -> bytes:
    """One user's private state (row ``row`` of ``state``) as a safetensors blob."""
    tensors = {}
    for part, table in (
        ("params", state.params),
        ("exp_avg", state.exp_avg),
        ("exp_avg_sq", state.exp_avg_sq),
    ):
        for name, t in table.items():
            tensors[f"{part}/{name}"] = t[row].detach().clone()
    return encode_state(tensors, {"format": STATE_FORMAT, "step": str(int(state.step[row]))})


def encode_private_rows(state: PrivateState, n: int | None = None) -> list[bytes]:
    """:func:`encode_private` of rows ``0 .. n-1`` of ``state`` (all by default), the same
    bytes, without a safetensors call per row: the rows share one header per step count (made
    by :func:`encode_private` of the first row with that count), and a row's data section is
    its tensors' row bytes in the header's offset order."""
    n = len(state.step) if n is None else n
    parts = {"params": state.params, "exp_avg": state.exp_avg, "exp_avg_sq": state.exp_avg_sq}
    arrays = {
        f"{part}/{name}": np.ascontiguousarray(t.detach().numpy())
        for part, table in parts.items()
        for name, t in table.items()
    }
    headers: dict[int, bytes] = {}
    order: list[str] = []
    out = []
    for i, step in enumerate(state.step[:n].tolist()):
        if step not in headers:
            blob = encode_private(state, i)
            size = 8 + int.from_bytes(blob[:8], "little")
            headers[step] = blob[:size]
            if not order:
                entries = json.loads(blob[8:size])
                entries.pop("__metadata__", None)
                order = sorted(entries, key=lambda k: entries[k]["data_offsets"][0])
        out.append(headers[step] + b"".join(arrays[k][i].tobytes() for k in order))
    return out


def decode_private(blobs: Sequence[bytes], steps: Sequence[int]) -> PrivateState:
    """Stack per-user blobs (as made by :func:`encode_private`) into one PrivateState."""
    parts: dict[str, dict[str, list[torch.Tensor]]] = {
        "params": {},
        "exp_avg": {},
        "exp_avg_sq": {},
    }
    for blob in blobs:
        tensors, meta = decode_state(blob)
        if meta.get("format") != STATE_FORMAT:
            raise StoreError(f"not a private-state blob (format={meta.get('format')!r})")
        for key, t in tensors.items():
            part, name = key.split("/", 1)
            parts[part].setdefault(name, []).append(t)
    stacked = {p: {n: torch.stack(ts) for n, ts in d.items()} for p, d in parts.items()}
    return PrivateState(
        params=stacked["params"],
        exp_avg=stacked["exp_avg"],
        exp_avg_sq=stacked["exp_avg_sq"],
        step=torch.tensor(list(steps), dtype=torch.int64),
    )
