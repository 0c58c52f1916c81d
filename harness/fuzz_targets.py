"""What the fuzz tests and ``bench/fuzz_services.py`` share: the credentials of each kind a
service knows, the state a service is fuzzed in, and how each service is fuzzed.

The aggregator is fuzzed with a registered shard and a running run, once per credential kind:
``anonymous`` (no Authorization header), ``client`` (the token a registration returned),
``reader``, ``operator`` and ``enrolment`` (a shard's enrolment token). With the operator token
``POST /v1/runs`` comes last and every run it manages to start is stopped at once, so each
generated config reaches the point where a model would be built.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import schemathesis

from harness.fuzz import Tally, fuzz
from services.enrolment import enrolment_token

# the operator comes last: it pauses, stops and starts runs
AGGREGATOR_KINDS = ("anonymous", "client", "reader", "enrolment", "operator")
START_RUN = "POST /v1/runs"
FLOAT32_MAX = 3.4028234663852886e38
# a small run: 50 items, the cohort is half of the registered clients
SMALL_RUN: dict[str, Any] = {
    "n_items": 50,
    "factor": 4,
    "layers": 2,
    "rounds": 3,
    "fraction": 0.5,
    "seed": 1,
    "deadline_s": 3600.0,
}


def bearer(token: str) -> dict[str, str]:
    """An Authorization header."""
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class AggregatorCredentials:
    """One credential of each kind the aggregator knows (None: no header)."""

    operator: str
    reader: str
    enrolment: str
    client: str

    def headers(self, kind: str) -> dict[str, str] | None:
        """The Authorization header of a credential kind (None for ``anonymous``)."""
        tokens = {
            "operator": self.operator,
            "reader": self.reader,
            "enrolment": self.enrolment,
            "client": self.client,
        }
        return None if kind == "anonymous" else bearer(tokens[kind])


def enrol_shard(
    base_url: str, secret: str, shard: int, shards: int, population: int
) -> tuple[str, str]:
    """Register every client id of one shard with its enrolment token; (enrolment token,
    client token)."""
    enrol = enrolment_token(secret, shard, shards)
    ids = list(range(shard, population, shards))
    r = httpx.post(
        f"{base_url}/v1/clients", json={"client_ids": ids}, headers=bearer(enrol), timeout=30
    )
    if r.status_code != 201:
        raise RuntimeError(f"registering shard {shard}/{shards}: {r.status_code} {r.text}")
    return enrol, str(r.json()["token"])


def start_run(base_url: str, operator: str, config: Mapping[str, Any] = SMALL_RUN) -> None:
    """Start a run with the operator token (RuntimeError unless it starts)."""
    r = httpx.post(f"{base_url}/v1/runs", json=dict(config), headers=bearer(operator), timeout=60)
    if r.status_code != 201:
        raise RuntimeError(f"starting a run: {r.status_code} {r.text}")


def stop_started_runs(base_url: str, operator: str) -> Callable[[str, int | None], None]:
    """A request callback that stops the run a ``POST /v1/runs`` just started, so the next
    generated config is built as well (instead of meeting the active run's 409)."""

    def after(label: str, status: int | None) -> None:
        if label == START_RUN and status == 201:
            httpx.post(f"{base_url}/v1/runs/current/stop", headers=bearer(operator), timeout=60)

    return after


def fuzz_aggregator(
    schema: schemathesis.BaseSchema,
    base_url: str,
    kind: str,
    creds: AggregatorCredentials,
    **kwargs: Any,
) -> Tally:
    """Fuzz the aggregator with one credential kind (``kwargs`` go to :func:`fuzz`)."""
    headers = creds.headers(kind)
    if kind != "operator":
        return fuzz(schema, base_url, service="aggregator", token=kind, headers=headers, **kwargs)
    tally = fuzz(
        schema,
        base_url,
        service="aggregator",
        token=kind,
        headers=headers,
        include=lambda label: label != START_RUN,
        **kwargs,
    )
    tally.merge(
        fuzz(
            schema,
            base_url,
            service="aggregator",
            token=kind,
            headers=headers,
            include=lambda label: label == START_RUN,
            on_request=stop_started_runs(base_url, creds.operator),
            **kwargs,
        )
    )
    return tally


def pin_to_model(
    raw: dict[str, Any], dims: Mapping[str, int], item_ids: Sequence[str], max_k: int
) -> dict[str, Any]:
    """A copy of recommend_api's OpenAPI document narrowed to the model it serves: user vectors
    of the model's lengths (``dims``: ``ModelConfig.private_dims()``, every one required) with
    values in the float32 range, ``k`` in ``1..max_k`` and excluded ids from the catalogue,
    so that generated requests reach the ranking instead of stopping at a length check."""
    doc = copy.deepcopy(raw)
    schemas = doc["components"]["schemas"]
    vector = schemas["UserVector"]
    for name, dim in dims.items():
        vector["properties"][name] = {
            "type": "array",
            "items": {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX},
            "minItems": dim,
            "maxItems": dim,
        }
    vector["required"] = sorted(dims)
    request = schemas["RecommendationRequest"]["properties"]
    request["k"] = {"type": "integer", "minimum": 1, "maximum": max_k}
    request["exclude"] = {"type": "array", "items": {"enum": list(item_ids)}}
    return doc


def pinned_schema(
    base_url: str, dims: Mapping[str, int], item_ids: Sequence[str], max_k: int
) -> schemathesis.BaseSchema:
    """recommend_api's document served at ``base_url``, narrowed by :func:`pin_to_model`."""
    raw = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    return schemathesis.openapi.from_dict(pin_to_model(raw, dims, item_ids, max_k))
