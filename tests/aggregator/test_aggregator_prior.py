"""The popularity prior at the aggregator: workers' item counts, checked, summed once they
cover every client and fixed; the prior read back with an ETag; evaluation reports with the
prior's sums publish the served ranking's figures, the weight and the model's own."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.prior import GUARD_NAMES, PRIOR_WEIGHTS
from fedrecgel.prior import key as prior_key
from harness.aggregator import AggregatorFactory, bearer, operator_headers, register, service_of
from services.aggregator.repository import Repository

N_ITEMS = 6
RUN = {"n_items": N_ITEMS, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.5, "seed": 7}


def _started(
    aggregator: AggregatorFactory, database_url: str | None = None, **run: Any
) -> tuple[TestClient, str, str]:
    """An aggregator (on ``database_url``, else a SQLite file) with clients 0-3 under token
    a, 4-5 under b, and a run started."""
    client = aggregator(database_url=database_url or aggregator.url(), population=6)
    a, b = register(client, [0, 1, 2, 3]), register(client, [4, 5])
    r = client.post("/v1/runs", json={**RUN, **run}, headers=operator_headers())
    assert r.status_code == 201, r.text
    return client, a, b


def _counts(
    client: TestClient, token: str, ids: list[int], items: list[int], counts: list[int]
) -> httpx.Response:
    body = {"client_ids": ids, "items": items, "counts": counts}
    r: httpx.Response = client.post("/v1/runs/1/item-counts", json=body, headers=bearer(token))
    return r


def test_counts_are_summed_once_they_cover_every_client(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    client, a, b = _started(aggregator, database_url)
    first = _counts(client, a, [0, 1, 2, 3], [0, 2, 5], [4, 1, 2])
    assert first.status_code == 202, first.text
    assert first.json() == {"accepted": 4, "ignored": 0, "complete": False}
    info = client.get("/v1/runs/current/prior", headers=bearer(a))
    assert info.status_code == 200
    assert info.json() == {
        "run_id": 1,
        "enabled": True,
        "complete": False,
        "counted": 4,
        "registered": 6,
        "counts": None,
        "weight": None,
        "weight_version": None,
    }
    again = _counts(client, a, [0, 1, 2, 3], [0], [1])  # a repeat of the same clients
    assert again.json() == {"accepted": 0, "ignored": 4, "complete": False}
    last = _counts(client, b, [4, 5], [0, 1], [2, 1])
    assert last.json() == {"accepted": 2, "ignored": 0, "complete": True}
    got = client.get("/v1/runs/1/prior", headers=bearer(b))
    assert got.json()["counts"] == [6, 1, 1, 0, 0, 2] and got.json()["complete"] is True
    etag = got.headers["ETag"]
    same = client.get("/v1/runs/current/prior", headers={**bearer(b), "If-None-Match": etag})
    assert same.status_code == 304
    late = _counts(client, b, [4, 5], [3], [2])  # fixed: nothing changes it any more
    assert late.json() == {"accepted": 0, "ignored": 2, "complete": True}
    assert client.get("/v1/runs/1/prior", headers=bearer(b)).json()["counts"][3] == 0


@pytest.mark.parametrize(
    ("ids", "items", "counts", "status", "code"),
    [
        ([0, 4], [0], [1], 403, "not_owned"),
        ([0, 1], [0, 1], [1], 422, "count_mismatch"),
        ([0, 1], [N_ITEMS], [1], 422, "item_out_of_range"),
        ([0, 1], [-1], [1], 422, "item_out_of_range"),
        ([0, 1], [2**64], [1], 422, "item_out_of_range"),  # beyond int64: was a 500
        ([0, 1], [0], [2**63], 422, "count_out_of_range"),
        ([0, 1], [0], [3], 422, "count_out_of_range"),  # more holders than clients
        ([0, 1], [0], [0], 422, "count_out_of_range"),
        ([0, 0], [0], [1], 422, "validation_error"),  # a client twice
        ([0, 1], [2, 2], [1, 1], 422, "validation_error"),  # an item twice
    ],
)
def test_a_bad_count_report_is_refused_and_stores_nothing(
    aggregator: AggregatorFactory,
    ids: list[int],
    items: list[int],
    counts: list[int],
    status: int,
    code: str,
) -> None:
    client, a, _ = _started(aggregator)
    r = _counts(client, a, ids, items, counts)
    assert r.status_code == status and r.json()["error"] == code, r.text
    info = client.get("/v1/runs/current/prior", headers=bearer(a)).json()
    assert info["counted"] == 0


def test_an_overlapping_report_is_refused(aggregator: AggregatorFactory) -> None:
    client, a, _ = _started(aggregator)
    assert _counts(client, a, [0, 1], [0], [2]).status_code == 202
    clash = _counts(client, a, [1, 2], [0], [1])
    assert clash.status_code == 409 and clash.json()["error"] == "counts_overlap"


@pytest.mark.parametrize(
    "run",
    [{"popularity_prior": False}, {"target_epsilon": 3.0}, {"secure_aggregation": "dense"}],
    ids=["off", "dp", "secure"],
)
def test_a_run_without_the_prior_takes_no_counts(
    aggregator: AggregatorFactory, run: dict[str, Any]
) -> None:
    client, a, _ = _started(aggregator, **run)
    r = _counts(client, a, [0, 1], [0], [1])
    assert r.status_code == 409 and r.json()["error"] == "prior_off", r.text
    assert client.get("/v1/runs/current/prior", headers=bearer(a)).json()["enabled"] is False


def test_no_run_no_prior(aggregator: AggregatorFactory) -> None:
    client = aggregator(database_url=aggregator.url(), population=6)
    a = register(client, [0, 1])
    r = client.get("/v1/runs/current/prior", headers=bearer(a))
    assert r.status_code == 404 and r.json()["error"] == "no_run"
    r = _counts(client, a, [0, 1], [0], [1])
    assert r.status_code == 404 and r.json()["error"] == "run_not_found"


def _prior_sums(
    count: int, model: float, served: dict[float, tuple[float, float, float]]
) -> dict[str, float]:
    """Evaluation sums over ``count`` clients: every metric at ``model`` for the model alone,
    and at each weight w ``served[w]`` = (metric, gain, loss) (the rest: the model's)."""
    plain = {n: model * count for n in METRIC_NAMES}
    out: dict[str, float] = {}
    for prefix in ("", "val/"):
        out.update({prefix + n: v for n, v in plain.items()})
        for w in PRIOR_WEIGHTS[1:]:
            m, gain, loss = served.get(w, (model, 0.0, 0.0))
            out.update({prefix + prior_key(w, n): m * count for n in METRIC_NAMES})
            out.update(
                {
                    prefix + prior_key(w, g): x * count
                    for g, x in zip(GUARD_NAMES, (gain, loss), strict=True)
                }
            )
    return out


def test_a_version_publishes_the_served_figures_the_weight_and_the_models(
    aggregator: AggregatorFactory,
) -> None:
    client, a, b = _started(aggregator)
    assert _counts(client, a, [0, 1, 2, 3], [0], [4]).status_code == 202
    assert _counts(client, b, [4, 5], [1], [2]).json()["complete"] is True
    # weight 2 moves every client into the served list and none out: 6 clients clear the sign test
    # (6 > 2 * sqrt(6)); weight 4 moves 5 in and 1 out, which does not (4 < 2 * sqrt(6))
    sums = _prior_sums(4, 0.0, {2.0: (1.0, 1.0, 0.0), 4.0: (1.0, 1.0, 0.0)})
    body = {"model_version": 0, "sums": sums, "count": 4, "client_ids": [0, 1, 2, 3]}
    assert client.post("/v1/evaluations", json=body, headers=bearer(a)).status_code == 202
    sums = _prior_sums(2, 0.0, {2.0: (1.0, 1.0, 0.0), 4.0: (1.0, 0.5, 0.5)})
    body = {"model_version": 0, "sums": sums, "count": 2, "client_ids": [4, 5]}
    r = client.post("/v1/evaluations", json=body, headers=bearer(b))
    assert r.json()["complete"] is True
    with service_of(client).db.read() as s:
        row = Repository(s).version_meta(1, 0)
        assert row is not None and row.metrics is not None
        m = row.metrics
    assert m["prior_weight"] == 2.0
    assert m["hr@10"] == pytest.approx(1.0) and m["val/hr@10"] == pytest.approx(1.0)
    assert m["model/hr@10"] == 0.0 and m["model/val/hr@10"] == 0.0
    assert not any(k.startswith("prior@") for k in m)
    info = client.get("/v1/runs/current/prior", headers=bearer(a)).json()
    assert (info["weight"], info["weight_version"]) == (2.0, 0)


def test_prior_sums_without_a_fixed_prior_are_refused(aggregator: AggregatorFactory) -> None:
    """Before the counts cover every client (or in a run without the prior) no honest worker
    ranks with a prior: such sums would publish figures of a ranking nobody serves."""
    client, a, _ = _started(aggregator)
    body = {"model_version": 0, "sums": _prior_sums(4, 0.5, {}), "count": 4}
    r = client.post("/v1/evaluations", json={**body, "client_ids": [0, 1, 2, 3]}, headers=bearer(a))
    assert r.status_code == 409 and r.json()["error"] == "no_prior", r.text


def test_a_report_with_part_of_the_prior_sums_is_refused(aggregator: AggregatorFactory) -> None:
    client, a, _ = _started(aggregator)
    sums = _prior_sums(4, 0.5, {})
    del sums["val/" + prior_key(8.0, "loss")]
    body = {"model_version": 0, "sums": sums, "count": 4, "client_ids": [0, 1, 2, 3]}
    r = client.post("/v1/evaluations", json=body, headers=bearer(a))
    assert r.status_code == 422 and r.json()["error"] == "invalid_metrics"
    assert "val/prior@8/loss" in r.json()["detail"]


DP_PRIOR: dict[str, Any] = {
    "target_epsilon": 1.0,
    "dp_prior_share": 0.5,
    "dp_prior_items": 2,
    "dp_clip": 0.5,
}


def test_a_dp_run_releases_its_counts_with_noise_once(aggregator: AggregatorFactory) -> None:
    """Under DP with a prior share the summed counts are fixed with Gaussian noise on every
    item (std z_p * sqrt(k), about 5 counts here): whole counts, at least 0, not the sums."""
    client, a, b = _started(aggregator, **DP_PRIOR)
    assert _counts(client, a, [0, 1, 2, 3], [0, 2, 5], [4, 2, 2]).status_code == 202
    assert _counts(client, b, [4, 5], [0, 1], [2, 1]).json()["complete"] is True
    got = client.get("/v1/runs/1/prior", headers=bearer(b)).json()
    counts = got["counts"]
    assert got["enabled"] is True and len(counts) == N_ITEMS
    assert all(isinstance(c, int) and c >= 0 for c in counts)
    # noise of std ~5 on six items: all six landing on the exact sums has odds below 1e-5
    assert counts != [6, 1, 2, 0, 0, 2]
    again = client.get("/v1/runs/1/prior", headers=bearer(a)).json()["counts"]
    assert again == counts  # one release, stored: reading it again draws nothing new


def test_a_dp_report_above_its_clients_item_bound_is_refused(aggregator: AggregatorFactory) -> None:
    client, a, _ = _started(aggregator, **DP_PRIOR)
    r = _counts(client, a, [0, 1], [0, 1, 2], [2, 1, 2])  # 5 > 2 clients * 2 items
    assert r.status_code == 422 and r.json()["error"] == "count_out_of_range", r.text
    assert "dp_prior_items" in r.json()["detail"]
    info = client.get("/v1/runs/current/prior", headers=bearer(a)).json()
    assert info["counted"] == 0
