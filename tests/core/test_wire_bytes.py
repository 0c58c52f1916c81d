"""The same model gives the same bytes (so the same sha256 and ETag) in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import safetensors.numpy
import torch

from fedrecgel.wire import decode_state, encode_state, st_save

ENCODE = """
import hashlib
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.wire import encode_model, encode_updates, decode_model
from fedrecgel.uploads import Update
import torch

cfg = ModelConfig(n_items=60, kind="ncf", factor=4, layers=2)
shared = init_shared(cfg, 7)
blob = encode_model(cfg, shared, 12)
assert decode_model(blob)[2] == 12
rows = {t: (torch.tensor([1, 5]), torch.ones(2, 4)) for t in cfg.item_tables()}
dense = {k: torch.zeros(cfg.shared_shapes()[k]) for k in cfg.dense_names()}
body = encode_updates(3, [Update(9, 10, rows, dense, 0.5)])
print(hashlib.sha256(blob).hexdigest(), hashlib.sha256(body).hexdigest())
"""


def _digests(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", ENCODE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_model_and_update_bytes_do_not_depend_on_the_process() -> None:
    # safetensors orders the metadata differently in each process (random hashing); with six
    # metadata keys, five processes agreeing by chance is about (1/720)^4 without the fix
    seen = {_digests(seed) for seed in ("0", "1", "2", "3", "random")}
    assert len(seen) == 1, seen


def _reference_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bytes:
    """The canonical file built the plain way: each tensor copied, the header re-sorted."""
    arrays = {k: v.detach().clone().contiguous().numpy() for k, v in tensors.items()}
    data = safetensors.numpy.save(arrays, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def test_encoded_bytes_need_no_copies_of_views() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "whole": base,
        "row": base[1],  # views of one buffer
        "cols": base[:, 2:5],  # not contiguous
        "t": base.t(),
        "grad": torch.ones(3, requires_grad=True),
        "ids": torch.tensor([3, 1, 2]),
    }
    for meta in (None, {}, {"z": "1", "a": "2", "format": "x", "m": "3"}):
        want = _reference_bytes(tensors, meta)
        assert st_save(tensors, metadata=meta) == want
        assert encode_state(tensors, metadata=meta) == want
    assert torch.equal(decode_state(encode_state(tensors))[0]["cols"], base[:, 2:5])
