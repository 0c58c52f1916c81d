"""``GET /v1/users?id=``: a device knows its user's id in the data (a CSV's ``alice``), the
device API's routes take the user's number in the split; the lookup gives one from the other,
for the users of the worker's shard only."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from fedrecgel.data import Split, load_split
from services.client_sim.routes import MAX_ID_CHARS, shard_user_ids
from services.client_sim.server import create_app, serve_in_thread
from services.client_sim.settings import WorkerError
from services.client_sim.store import WorkerStore
from tests.client_sim.device_api import (
    WITH_TOKEN,
    WRONG_TOKEN,
    behind_token,
    device_split,
    get,
    model_holder,
    settings_for,
    shard_store,
)

# text ids (one with a space, one not ASCII), first appearances out of alphabetical order
NAMES = ["zoe", "alice", "bob", "émile", *(f"shopper {i}" for i in range(20))]
# every user's items distinct; 150 items, enough for the 99 test negatives
ROWS = [(name, f"m{(u * 7 + k * 13) % 150}", k) for u, name in enumerate(NAMES) for k in range(7)]


@pytest.fixture(scope="module")
def split() -> Split:
    return device_split()


def _csv(folder: Path) -> Path:
    path = folder / "shop.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{user},{item},{t}" for user, item, t in ROWS]
    path.write_text("user,item,timestamp\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_csv_users_text_id_gives_the_number_whose_training_items_are_its_rows(
    tmp_path: Path,
) -> None:
    _csv(tmp_path / "data")
    settings = settings_for(
        tmp_path, dataset="shop", data_dir=tmp_path / "data", http_port=0, log_level="WARNING"
    )
    split = load_split("shop", tmp_path / "data", validation=settings.validation)
    labels = [str(x) for x in split.user_labels.tolist()]
    assert sorted(labels) == sorted(NAMES)
    store = WorkerStore(tmp_path / "w.db")
    mine = [u for u in range(split.n_users) if u % 2 == 0]
    store.add_users(split, mine)
    server = serve_in_thread(settings, store)  # loads the CSV's ids itself
    base = f"http://127.0.0.1:{server.port}"
    try:
        with httpx.Client(base_url=base, timeout=10.0) as c:
            for u, name in enumerate(labels):
                found = c.get("/v1/users", params={"id": name})
                if u not in mine:  # a user of the other shard
                    assert found.status_code == 404, found.text
                    assert found.json()["error"] == "unknown_user"
                    continue
                assert found.status_code == 200, found.text
                assert found.json() == {"user_id": u, "id": name}
                items = c.get(f"/v1/users/{found.json()['user_id']}/training-items").json()
                rows = {item for user, item, _ in ROWS if user == name}
                held = {split.test_items[u]} | (
                    set() if split.val_items is None else {split.val_items[u]}
                )
                held_out = {str(split.item_labels[i]) for i in held}
                assert set(items["items"]) == rows - held_out and held_out < rows
            for nobody in ("nobody", "ALICE", "0", "alice "):
                r = c.get("/v1/users", params={"id": nobody})
                assert r.status_code == 404 and r.json()["error"] == "unknown_user", nobody
                assert set(r.json()) == {"error", "detail"}
    finally:
        server.stop()


def test_without_the_datas_ids_a_users_id_is_its_number_in_decimal(
    tmp_path: Path, split: Split
) -> None:
    store, settings, holder = shard_store(tmp_path, split), settings_for(tmp_path), model_holder()
    r = get(settings, store, holder, "/v1/users", id="4")
    assert r.status_code == 200 and r.json() == {"user_id": 4, "id": "4"}, r.text
    for other in ("3", "04", "+4", str(split.n_users + 2)):  # shard 1, not plain, none
        r = get(settings, store, holder, "/v1/users", id=other)
        assert r.status_code == 404 and r.json()["error"] == "unknown_user", other


@pytest.mark.parametrize("path", ["/v1/users", "/v1/users?id=", "/v1/users?id=" + "a" * 257])
def test_an_id_missing_empty_or_too_long_is_422(tmp_path: Path, split: Split, path: str) -> None:
    store, settings, holder = shard_store(tmp_path, split), settings_for(tmp_path), model_holder()
    r = get(settings, store, holder, path)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error" and "query.id" in r.json()["detail"]
    longest = get(settings, store, holder, "/v1/users", id="a" * MAX_ID_CHARS)
    assert longest.status_code == 404, longest.text


def test_the_document_names_the_lookup_and_no_private_state(tmp_path: Path) -> None:
    app = create_app(settings_for(tmp_path), WorkerStore(tmp_path / "w.db"), ["a"])
    doc = app.openapi()
    op = doc["paths"]["/v1/users"]["get"]
    assert [(p["name"], p["in"], p["required"]) for p in op["parameters"]] == [
        ("id", "query", True)
    ]
    assert {"200", "401", "403", "404", "422"} <= set(op["responses"])
    text = json.dumps(doc)
    for word in ("user_gmf", "user_mlp", "embedding", "interactions", "exp_avg"):
        assert word not in text, word


def test_store_users_beyond_the_splits_ids_are_refused() -> None:
    assert shard_user_ids([0, 2], ["a", "b", "c"]) == {"a": 0, "c": 2}
    assert shard_user_ids([0, 2], None) == {"0": 0, "2": 2}
    with pytest.raises(WorkerError, match="not one of the split's 3"):
        shard_user_ids([0, 4], ["a", "b", "c"])


def test_the_lookup_needs_the_device_token_when_one_is_set(tmp_path: Path, split: Split) -> None:
    calls = [
        ("/v1/users?id=0", None),
        ("/v1/users?id=0", WRONG_TOKEN),
        ("/v1/users?id=3", None),  # another shard's: refused before the lookup
        ("/v1/users", WITH_TOKEN),
        ("/v1/users?id=0", WITH_TOKEN),
    ]
    *refused, bad, ok = behind_token(tmp_path, split, calls)
    for r in refused:
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
    assert bad.status_code == 422
    assert ok.status_code == 200 and ok.json() == {"user_id": 0, "id": "0"}, ok.text
