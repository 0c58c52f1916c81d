"""The worker's demo HTTP API against the real recommend_api app, in one process: what it
answers and how it refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedrecgel.data import Split
from fedrecgel.model import init_shared
from fedrecgel.sam import PrivateState
from services.client_sim.routes import MAX_K, device_request
from services.recommend_api.ranking import ModelHolder, RankingConfig
from tests.client_sim.device_api import (
    CFG,
    LABELS,
    SEED,
    both,
    device_split,
    get,
    model_holder,
    settings_for,
    shard_store,
    worker_api,
)


@pytest.fixture(scope="module")
def split() -> Split:
    return device_split()


def test_recommendations_are_recommend_api_answer_for_the_users_own_vector(
    tmp_path: Path, split: Split
) -> None:
    store, holder, user = shard_store(tmp_path, split), model_holder(4), 4
    r = get(settings_for(tmp_path), store, holder, f"/v1/users/{user}/recommendations", k=5)
    assert r.status_code == 200, r.text
    body = r.json()
    params = store.load_states([user]).params
    train = sorted({int(i) for i in split.user_train(user)})
    expected = holder.recommend(
        params["user_gmf"][0].tolist(),
        params["user_mlp"][0].tolist(),
        5,
        [LABELS[i] for i in train],
    )
    assert body["model_version"] == 4
    got: list[tuple[str, object]] = [
        (it["item"], pytest.approx(it["score"])) for it in body["items"]
    ]
    assert got == expected.items
    assert not {it["item"] for it in body["items"]} & {LABELS[i] for i in train}
    assert set(body) == {"model_version", "items", "prior_weight"}  # never the user vector


def test_device_request_excludes_training_items_once_by_label(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)
    body = device_request(store, LABELS, 2, 10)
    train = sorted({int(i) for i in split.user_train(2)})
    assert body["exclude"] == [LABELS[i] for i in train] and body["k"] == 10
    assert set(body["user"]) == {"user_gmf", "user_mlp"}
    assert device_request(store, None, 2, 3)["exclude"] == [str(i) for i in train]


def test_user_of_another_shard_is_404(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)

    async def go() -> list[httpx.Response]:
        async with both(settings_for(tmp_path), store, model_holder()) as c:
            return [
                await c.get("/v1/users/3/recommendations"),  # odd: shard 1
                await c.get(f"/v1/users/{split.n_users + 10}/recommendations"),
            ]

    for r in asyncio.run(go()):
        assert r.status_code == 404
        assert r.json()["error"] == "unknown_user"


@pytest.mark.parametrize("k", ["0", "-1", "1001", "ten"])
def test_bad_k_is_422(tmp_path: Path, split: Split, k: str) -> None:
    store = shard_store(tmp_path, split)
    r = get(settings_for(tmp_path), store, model_holder(), "/v1/users/0/recommendations", k=k)
    assert r.status_code == 422
    assert r.json()["error"] == "validation_error" and "k" in r.json()["detail"]


def test_non_integer_user_is_422(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)
    r = get(settings_for(tmp_path), store, model_holder(), "/v1/users/abc/recommendations")
    assert r.status_code == 422


def test_user_without_private_state_is_503(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split, with_state=False)
    r = get(settings_for(tmp_path), store, model_holder(), "/v1/users/0/recommendations")
    assert r.status_code == 503 and r.json()["error"] == "no_private_state"


def test_recommend_api_without_a_model_passes_its_503_through(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)
    r = get(settings_for(tmp_path), store, model_holder(None), "/v1/users/0/recommendations")
    assert r.status_code == 503 and r.json()["error"] == "no_model"


def test_unreachable_or_refusing_recommend_api_is_502(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def refuses(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"error": "unknown_items", "detail": "'film-1'"})

    async def go(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Response:
        async with worker_api(settings_for(tmp_path), store, httpx.MockTransport(handler)) as c:
            return await c.get("/v1/users/0/recommendations")

    r = asyncio.run(go(down))
    assert r.status_code == 502 and r.json()["error"] == "recommend_unavailable"
    r = asyncio.run(go(refuses))
    assert r.status_code == 502 and "unknown_items" in r.json()["detail"]


def test_healthz_reports_the_shard(tmp_path: Path, split: Split) -> None:
    store, settings, holder = shard_store(tmp_path, split), settings_for(tmp_path), model_holder()
    r = get(settings, store, holder, "/healthz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "store": "ok",
        "registered": False,
        "shard": 0,
        "shards": 2,
        "users": 6,
    }
    store.set_meta(token="t")
    assert get(settings, store, holder, "/healthz").json()["registered"] is True


@pytest.mark.parametrize(
    "path",
    [
        "/v1/users/0/recommendations?k=10.0",
        "/v1/users/0/recommendations?k=%2B10",
        "/v1/users/0/recommendations?k=010",
        "/v1/users/0/recommendations?k=1_0",
        "/v1/users/0/recommendations?k=true",
        "/v1/users/0.0/recommendations",
        "/v1/users/%2B0/recommendations",
        "/v1/users/1_0/recommendations",
    ],
)
def test_integers_in_paths_and_queries_are_plain_decimal(
    tmp_path: Path, split: Split, path: str
) -> None:
    store = shard_store(tmp_path, split)
    r = get(settings_for(tmp_path), store, model_holder(), path)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error"


def test_an_id_of_too_many_digits_is_told_the_limit(tmp_path: Path, split: Split) -> None:
    """It was told it was not 'in decimal digits', which it was."""
    store = shard_store(tmp_path, split)
    r = get(
        settings_for(tmp_path), store, model_holder(), "/v1/users/" + "9" * 23 + "/training-items"
    )
    assert r.status_code == 422 and "at most 19 digits" in r.json()["detail"], r.text


def test_405_names_the_allowed_methods_and_bodies_are_bounded(tmp_path: Path, split: Split) -> None:
    store = shard_store(tmp_path, split)

    async def go() -> list[httpx.Response]:
        async with both(
            settings_for(tmp_path, http_max_body_bytes=1024), store, model_holder()
        ) as c:
            return [
                await c.post("/v1/users/0/recommendations"),
                await c.request("GET", "/v1/users/0/recommendations", content=b"x" * 2048),
            ]

    not_allowed, too_large = asyncio.run(go())
    assert not_allowed.status_code == 405 and not_allowed.headers["allow"] == "GET, HEAD"
    assert not_allowed.json()["error"] == "method_not_allowed"
    assert too_large.status_code == 413 and too_large.json()["error"] == "body_too_large"


def test_the_device_reads_its_own_training_items_and_may_rank_them_too(
    tmp_path: Path, split: Split
) -> None:
    store, holder, user = shard_store(tmp_path, split, with_state=False), model_holder(4), 2
    train = [LABELS[i] for i in sorted({int(i) for i in split.user_train(user)})]

    async def go() -> list[httpx.Response]:
        async with both(settings_for(tmp_path), store, holder) as c:
            items = await c.get(f"/v1/users/{user}/training-items")  # no private state needed
            store.reset_states([user], PrivateState.fresh(CFG, SEED, np.asarray([user])))
            return [
                items,
                await c.get(f"/v1/users/{user}/recommendations?k=30&include_training=true"),
                await c.get(f"/v1/users/{user}/recommendations?k=30&include_training=false"),
                await c.get(f"/v1/users/{user}/recommendations?include_training=yes"),
                await c.get("/v1/users/3/training-items"),  # shard 1
                await c.get(f"/v1/users/{split.n_users + 10}/training-items"),
                await c.get("/v1/users/%2B2/training-items"),
            ]

    items, with_train, without, bad_flag, *unknown, bad_id = asyncio.run(go())
    assert items.status_code == 200, items.text
    assert items.json() == {"user_id": user, "items": train} and train
    # include_training: every item ranked (the training items among them), else left out
    ranked = [it["item"] for it in with_train.json()["items"]]
    assert sorted(ranked) == sorted(LABELS)
    params = store.load_states([user]).params
    expected = holder.recommend(
        params["user_gmf"][0].tolist(), params["user_mlp"][0].tolist(), 30, []
    )
    assert ranked == [item for item, _ in expected.items]
    kept = [it["item"] for it in without.json()["items"]]
    assert sorted(kept) == sorted(set(LABELS) - set(train))
    assert bad_flag.status_code == 422 and bad_id.status_code == 422
    for r in unknown:
        assert r.status_code == 404 and r.json()["error"] == "unknown_user", r.text


def test_a_run_that_fits_embeddings_sends_the_fitted_vector(tmp_path: Path, split: Split) -> None:
    """With ``rank_fit_steps`` the worker's evaluation gives each user's embeddings as fitted
    to the newest scored version: the device sends those, and its stored ones otherwise."""
    store = shard_store(tmp_path, split)
    fitted = {"user_gmf": [0.5] * CFG.factor, "user_mlp": [-0.25] * CFG.mlp_dim}

    def fitted_of(user: int) -> dict[str, list[float]] | None:
        return fitted if user == 4 else None

    body = device_request(store, LABELS, 4, 3, fitted=fitted_of)
    assert body["user"] == fitted
    stored = store.load_states([6]).params
    body = device_request(store, LABELS, 6, 3, fitted=fitted_of)
    assert body["user"] == {k: v[0].tolist() for k, v in stored.items()}


def test_any_k_outside_its_range_has_one_message_naming_the_range(
    tmp_path: Path, split: Split
) -> None:
    """k=-1 was 'a non-negative integer', k=0 'greater than or equal to 1' and k=1001 'less
    than or equal to 1000': one message now, whatever the value."""
    store, settings, holder = shard_store(tmp_path, split), settings_for(tmp_path), model_holder()
    details = set()
    for k in ["0", "-1", "1001", "ten", "010", "99999999999999999999"]:
        r = get(settings, store, holder, "/v1/users/0/recommendations", k=k)
        assert r.status_code == 422, (k, r.text)
        details.add(r.json()["detail"])
    assert len(details) == 1, details
    # the validator's words alone (pydantic put "Value error, " before them)
    assert details.pop() == (
        f"query.k: must be an integer from 1 to {MAX_K}, in plain decimal digits (one user's "
        "list; recommend_api takes longer ones itself)"
    )
    for k in ["1", str(MAX_K)]:
        r = get(settings, store, holder, "/v1/users/0/recommendations", k=k)
        assert r.status_code == 200 and 1 <= len(r.json()["items"]) <= int(k), r.text


def test_a_k_over_a_lower_recommend_api_bound_is_the_requests_422_not_a_502(
    tmp_path: Path, split: Split
) -> None:
    """recommend_api set to shorter lists (FEDREC_REC_MAX_K) than this API's MAX_K: a k between
    the two was answered 502 recommend_error, as if recommend_api had failed."""
    store, bound = shard_store(tmp_path, split), 5
    holder = ModelHolder(RankingConfig(max_k=bound), labels=LABELS)
    holder.swap(holder.build(CFG, init_shared(CFG, 1), 4))
    r = get(settings_for(tmp_path), store, holder, "/v1/users/0/recommendations", k=bound + 1)
    assert r.status_code == 422 and r.json()["error"] == "k_too_large", r.text
    assert f"at most {bound}, got {bound + 1}" in r.json()["detail"], r.text
    r = get(settings_for(tmp_path), store, holder, "/v1/users/0/recommendations", k=bound)
    assert r.status_code == 200 and len(r.json()["items"]) == bound, r.text
