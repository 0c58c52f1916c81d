"""The popularity prior of a sparse secure run at the aggregator: instance A's unmasked counts
summed over the rounds in the transaction that moves each round on, and the prior fixed to
their estimate once they cover the registered clients (fedrecgel.prior.RoundPrior); the run
takes no count reports."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fedrecgel.prior import RoundCounts, RoundPrior
from fedrecgel.secagg.aggregate import item_indicator
from harness.aggregator import AggregatorFactory, bearer, service_of
from services.aggregator.models import RoundItemCounts
from services.aggregator.popularity import CountRepository, decode_counts
from tests.aggregator.test_aggregator_secagg import IDS, MODEL
from tests.aggregator.test_aggregator_secagg_sparse import SparseRound

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def test_a_sparse_rounds_unmasked_counts_are_summed_for_the_prior(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = SparseRound(aggregator, tmp_path)
    rnd.keys()
    rnd.shares()
    rnd.masked()
    rnd.reveal()  # A unmasked: the union is formed and the counts summed
    assert rnd.phase() == "masked_b"
    want = sum(item_indicator(MODEL, rnd.updates[u], rnd.pool) for u in IDS)
    with service_of(rnd.http).db.read() as s:
        row = s.get(RoundItemCounts, 1)
        assert row is not None and row.counted == len(IDS)
        assert np.array_equal(decode_counts(row.counts), np.rint(want).astype(np.int64))
        assert CountRepository(s).prior(1) is None  # once over: not fixed yet
    info = rnd.http.get("/v1/runs/1/prior", headers=bearer(rnd.tokens[0])).json()
    assert info["enabled"] is True and info["complete"] is False
    refused = rnd.http.post(
        "/v1/runs/1/item-counts",
        json={"client_ids": [0], "items": [1], "counts": [1]},
        headers=bearer(rnd.tokens[0]),
    )
    assert refused.status_code == 409 and refused.json()["error"] == "prior_off"


def test_the_prior_is_fixed_to_the_estimate_once_the_counts_cover_twice(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = SparseRound(aggregator, tmp_path)
    n = MODEL.n_items
    rounds = [
        RoundCounts(np.arange(n) % 3, np.array([0, 1]), 8),
        RoundCounts(np.arange(n) % 5, np.array([2, 3]), 8),
    ]
    want = RoundPrior(n)
    with service_of(rnd.http).db.transaction() as s:
        for got in rounds:
            want.add(got)
            fixed = CountRepository(s).add_round(1, got, NOW)
        assert fixed  # the second round covered the 8 clients twice
        assert not CountRepository(s).add_round(1, rounds[0], NOW)  # kept as fixed
    info = rnd.http.get("/v1/runs/1/prior", headers=bearer(rnd.tokens[0])).json()
    assert info["complete"] is True and info["counted"] == len(IDS)
    assert info["counts"] == want.estimate(len(IDS)).tolist()
