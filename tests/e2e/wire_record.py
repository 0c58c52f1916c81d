"""Looking for anything private in the bodies of a run on the wire (recorded by
:class:`harness.recording.RecordingTransport`): keys beyond the API's, tensors beyond the shared
model, a user's private vectors or item list."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load

from fedrecgel.data import Split
from harness.recording import Exchange
from services.client_sim.store import WorkerStore

SHARED_TENSOR = re.compile(
    r"^(\d+/)?(item_gmf|item_mlp)(\.rows|\.values)?$|^(\d+/)?(tower\.\d+|predict)\.(weight|bias)$"
)
MODEL_META = {"format", "version", "kind", "n_items", "factor", "layers"}
UPDATES_META = {"format", "round", "updates"}
UPDATE_ENTRY = {"client_id", "n_samples", "loss"}
PARTIAL_META = {"format", "round", "clients", "loss"}
PARTIAL_ENTRY = {"client_id", "n_samples"}
#: an evaluation sum: a metric, and with the run's popularity prior the same at each weight with
#: the sign test's counts; published metrics add the weight and the model's own (``model/``)
METRIC = r"(val/)?((hr|ndcg)@\d+|prior@[\d.]+/((hr|ndcg)@\d+|gain|loss))"
PUBLISHED = r"(model/)?(val/)?(hr|ndcg)@\d+|prior_weight"
RUN_CONFIG = (
    "n_items|kind|factor|layers|rounds|eval_every|fraction|seed|optimizer|server_lr|weighting|clip|"
    "rho_sh|rho_ns|client_lr|n_negatives|negative_pool|chunk_size|deadline_s|quorum|dataset|sampling|"
    "cohort_groups|"
    "dp_clip|dp_clip_quantile|dp_noise|dp_mode|dp_delta|target_epsilon|dp_prior_share|dp_item_share|"
    "dp_prior_items|secure_aggregation|"
    "secagg_neighbours|"
    "secagg_dropout|secagg_range|secagg_scale_bits|upload_grouping|server_beta1|server_beta2|"
    "server_momentum|server_warmup|server_decay|client_weight_decay|local_steps|"
    "server_weight_decay|server_mean|trim_fraction|server_update|popularity_prior|"
    "rank_fit_steps|rank_fit_lr"
)
ERROR_KEYS = {"error", "detail"}
#: the keys of a current-round answer (``GET /v1/rounds/current``, a closing upload's ``current``)
CURRENT_ROUND = (
    rf"run_id|round_id|attempt|state|deadline|model_version|cohort|cohort_size|config"
    rf"|config\.({RUN_CONFIG})"
)
# (method, path regex) -> (request key paths, response key paths), regexes over dotted paths
# (list elements as ``[]``); from docs/API.md
API_KEYS: list[tuple[str, str, str, str]] = [
    ("POST", r"/v1/clients", r"client_ids|token", r"token|client_ids"),
    ("GET", r"/v1/clients/count", r"", r"registered"),
    ("GET", r"/v1/rounds/current", r"", CURRENT_ROUND),
    # the upload that closes a round is answered with the round after it
    (
        "POST",
        r"/v1/rounds/\d+/updates",
        r"",
        rf"results|results\[\]\.(client_id|status)|current|current\.({CURRENT_ROUND})",
    ),
    (
        "POST",
        r"/v1/evaluations",
        rf"model_version|sums|sums\.{METRIC}|count|client_ids",
        r"model_version|accepted|ignored|complete",
    ),
    (
        "POST",
        r"/v1/runs",
        rf"{RUN_CONFIG}",
        rf"run_id|state|round_id|model_version|cohort_size|config|config\.({RUN_CONFIG})",
    ),
    (
        "GET",
        r"/v1/runs/current/history",
        r"",
        rf"run_id|planned_rounds|delta|noise_multiplier|next_after|evaluated_through|rounds|rounds\[\]\.(round_id|model_version|n_updates|loss|metrics"
        rf"|closed_at|seconds|epsilon|n_bounded)|rounds\[\]\.metrics\.({PUBLISHED})",
    ),
    # the popularity prior: a worker's counts summed over its users, the run's sum read back
    (
        "POST",
        r"/v1/runs/\d+/item-counts",
        r"client_ids|items|counts",
        r"accepted|ignored|complete",
    ),
    (
        "GET",
        r"/v1/runs/(\d+|current)/prior",
        r"",
        r"run_id|enabled|complete|counted|registered|counts|weight|weight_version",
    ),
]


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key of a JSON value as a dotted path (list elements as ``[]``)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(obj, list):
        for v in obj:
            out |= key_paths(v, f"{prefix}[]")
    return out


def safetensors_header(body: bytes) -> dict[str, Any]:
    """The JSON header of a safetensors blob."""
    n = int.from_bytes(body[:8], "little")
    header: dict[str, Any] = json.loads(body[8 : 8 + n])
    return header


def check_safetensors(ex: Exchange, direction: str, body: bytes) -> list[str]:
    """Problems of a safetensors body: tensor names and metadata beyond the shared model."""
    header = safetensors_header(body)
    meta = header.pop("__metadata__", {}) or {}
    problems = [
        f"{ex.method} {ex.path} {direction}: tensor {name!r}"
        for name in header
        if not SHARED_TENSOR.match(name)
    ]
    if meta.get("format") == "fedrecgel-updates":
        if set(meta) != UPDATES_META:
            problems.append(f"{ex.path}: upload metadata {sorted(meta)}")
        for entry in json.loads(meta.get("updates", "[]")):
            if set(entry) != UPDATE_ENTRY:
                problems.append(f"{ex.path}: update entry {sorted(entry)}")
    elif meta.get("format") == "fedrecgel-partial":
        if set(meta) != PARTIAL_META:
            problems.append(f"{ex.path}: partial-sum metadata {sorted(meta)}")
        for entry in json.loads(meta.get("clients", "[]")):
            if set(entry) != PARTIAL_ENTRY:
                problems.append(f"{ex.path}: partial-sum client entry {sorted(entry)}")
    elif meta.get("format") == "fedrecgel-model":
        if set(meta) != MODEL_META:
            problems.append(f"{ex.path}: model metadata {sorted(meta)}")
    else:
        problems.append(f"{ex.method} {ex.path} {direction}: unknown blob format {meta!r}")
    return problems


def check_json(ex: Exchange, direction: str, body: bytes) -> list[str]:
    """Problems of a JSON body: keys the API does not define for this endpoint."""
    keys = key_paths(json.loads(body))
    if direction == "response" and ex.status >= 400:
        extra = keys - ERROR_KEYS
        return [f"{ex.method} {ex.path} error body keys {sorted(extra)}"] if extra else []
    for method, path, req, resp in API_KEYS:
        if ex.method == method and re.fullmatch(path, ex.path):
            allowed = re.compile(req if direction == "request" else resp)
            extra = {k for k in keys if not allowed.fullmatch(k)}
            return [f"{ex.method} {ex.path} {direction}: keys {sorted(extra)}"] if extra else []
    return [f"{ex.method} {ex.path} {direction}: JSON on an endpoint the run should not use"]


def private_vectors(stores: list[WorkerStore]) -> list[bytes]:
    """The float32 bytes of every user's private vectors and Adam moments (rows that carry
    information: a vector of a few distinct values, e.g. the zero moments of a user never
    trained, is skipped)."""
    out: list[bytes] = []
    for store in stores:
        state = store.load_states(store.user_ids().tolist())
        for group in (state.params, state.exp_avg, state.exp_avg_sq):
            for t in group.values():
                rows = t.to(torch.float32).contiguous().numpy()
                for row in rows:
                    if len(np.unique(row)) > len(row) // 2:
                        out.append(row.tobytes())
    return out


def find_needles(haystack: bytes, needles: list[bytes]) -> list[int]:
    """Indices of ``needles`` (each a multiple of 4 bytes long) that occur in ``haystack``
    at any byte offset."""
    if not needles:
        return []
    heads = np.frombuffer(b"".join(n[:4] for n in needles), dtype="<u4")
    order = np.argsort(heads, kind="stable")
    keys = heads[order]
    found: set[int] = set()
    for align in range(4):
        count = (len(haystack) - align) // 4
        if count <= 0:
            continue
        words = np.frombuffer(haystack, dtype="<u4", offset=align, count=count)
        pos = np.searchsorted(keys, words)
        pos[pos == len(keys)] = 0
        for w in np.flatnonzero(keys[pos] == words):
            start = align + 4 * int(w)
            j = int(np.searchsorted(keys, words[w]))
            while j < len(keys) and keys[j] == words[w]:
                idx = int(order[j])
                if haystack[start : start + len(needles[idx])] == needles[idx]:
                    found.add(idx)
                j += 1
    return sorted(found)


def interaction_problems(split: Split, exchanges: list[Exchange]) -> list[str]:
    """Bodies that carry a user's training-item list.

    JSON bodies (and the JSON headers of safetensors bodies) must not contain any user's list
    as JSON text. Integer tensors only occur as the row indices of item-table gradients; each
    is the union of the client's positives and its sampled negatives, so none may equal a
    user's item set (users with fewer than 3 distinct items are not telling and are skipped).
    """
    lists: dict[frozenset[int], int] = {}
    texts: list[tuple[int, bytes]] = []
    for u in range(split.n_users):
        items = [int(i) for i in split.user_train(u)]
        if len(set(items)) < 3:
            continue
        lists[frozenset(items)] = u
        texts.append((u, json.dumps(items).encode()))
        texts.append((u, json.dumps(items, separators=(",", ":")).encode()))
    problems: list[str] = []
    n_rows = 0
    for ex in exchanges:
        for direction, ctype, body in ex.bodies():
            where = f"{ex.method} {ex.path} {direction}"
            text = body
            if ctype.startswith("application/octet-stream"):
                text = body[: 8 + int.from_bytes(body[:8], "little")]
                for name, t in st_load(body).items():
                    if t.dtype in (torch.int64, torch.int32):
                        n_rows += 1
                        user = lists.get(frozenset(int(i) for i in t.tolist()))
                        if user is not None:
                            problems.append(f"{where}: {name} is the item set of user {user}")
            problems += [f"{where}: items of user {u} as JSON" for u, f in texts if f in text]
    if n_rows == 0:
        problems.append("no row-index tensor was seen: nothing was checked")
    return problems
