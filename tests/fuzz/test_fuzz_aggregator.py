"""The aggregator under schema-driven fuzzing, once per credential kind it knows: no 5xx, no
answer its OpenAPI document does not describe, no invalid request accepted, no hang.

Each kind gets a fresh aggregator (SQLite in a temp dir) with one enrolled shard and a running
run; the server runs in a thread of this process under an address-space limit, so a model too
large to build fails the request instead of exhausting the machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.fuzz import load_schema, operation_labels
from harness.fuzz_targets import (
    AGGREGATOR_KINDS,
    AggregatorCredentials,
    enrol_shard,
    fuzz_aggregator,
    start_run,
)
from services.aggregator.app import create_app
from tests.fuzz.servers import address_space_headroom
from tests.support.aggregator import OPERATOR_TOKEN, make_settings, sqlite_url
from tests.support.loopback import serve_app

EXAMPLES = 15  # per operation and generation mode (valid, invalid requests)
READER_TOKEN = "fuzz-reader-token-5f0c2a9e41d7b3"
ENROLMENT_SECRET = "fuzz-enrolment-secret-9b1e7d3c52a8f4"
POPULATION = 40
SHARDS = 2
# what the server may map beyond what this process maps already
HEADROOM_BYTES = 4 << 30


@dataclass(frozen=True)
class Aggregator:
    """A served aggregator and a credential of each kind."""

    url: str
    creds: AggregatorCredentials


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[Aggregator]:
    settings = make_settings(
        sqlite_url(tmp_path),
        reader_token=READER_TOKEN,
        enrolment_secret=ENROLMENT_SECRET,
        population=POPULATION,
        # small enough that each fuzzed run config is built (or refused) quickly
        max_model_params=200_000,
    )
    with address_space_headroom(HEADROOM_BYTES), serve_app(create_app(settings)) as url:
        enrol, client = enrol_shard(url, ENROLMENT_SECRET, 0, SHARDS, POPULATION)
        start_run(url, OPERATOR_TOKEN)
        yield Aggregator(url, AggregatorCredentials(OPERATOR_TOKEN, READER_TOKEN, enrol, client))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", AGGREGATOR_KINDS)
def test_aggregator_survives_fuzzing(aggregator: Aggregator, kind: str) -> None:
    schema = load_schema(aggregator.url)
    tally = fuzz_aggregator(schema, aggregator.url, kind, aggregator.creds, max_examples=EXAMPLES)
    # every operation of the document was tried (the fuzz did not silently skip any)
    assert set(tally.by_operation) == operation_labels(schema), tally.by_operation
    assert tally.requests >= 2 * len(tally.by_operation)
    assert tally.clean, f"{tally.requests} requests with the {kind} token:\n{tally.report()}"
