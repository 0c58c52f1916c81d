"""The worker's local store: bit-exact round trips, persistence, and nothing pickled."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy
import torch
from safetensors.torch import load as st_load
from sqlalchemy.orm.exc import StaleDataError

import services.client_sim.aggregator_client as client_module
import services.client_sim.store as store_module
import services.client_sim.worker as worker_module
from fedrecgel.data import Split
from fedrecgel.model import ModelConfig
from fedrecgel.sam import PrivateState
from fedrecgel.synthetic import synthetic_split
from services.client_sim.store import (
    Progress,
    UserRow,
    WorkerStore,
    decode_private,
    encode_private,
    encode_private_rows,
)


@pytest.fixture(scope="module")
def split() -> Split:
    return synthetic_split(n_users=12, n_items=40, seed=2, n_test_negatives=10, validation=True)


def _random_state(n: int, seed: int = 0) -> PrivateState:
    cfg = ModelConfig(n_items=40, factor=4, layers=2)
    gen = torch.Generator().manual_seed(seed)
    dims = cfg.private_dims()
    return PrivateState(
        params={k: torch.randn(n, d, generator=gen) for k, d in dims.items()},
        exp_avg={k: torch.randn(n, d, generator=gen) for k, d in dims.items()},
        exp_avg_sq={k: torch.rand(n, d, generator=gen) for k, d in dims.items()},
        step=torch.randint(0, 1000, (n,), generator=gen),
    )


def _assert_state_equal(a: PrivateState, b: PrivateState) -> None:
    for part in ("params", "exp_avg", "exp_avg_sq"):
        pa, pb = getattr(a, part), getattr(b, part)
        assert pa.keys() == pb.keys()
        for k in pa:
            assert pa[k].dtype == pb[k].dtype and torch.equal(pa[k], pb[k]), (part, k)
    assert torch.equal(a.step, b.step)


def _store(tmp_path: Path, split: Split) -> WorkerStore:
    s = WorkerStore(tmp_path / "w.db")
    s.add_users(split, [1, 4, 7, 10])
    return s


def test_state_round_trip_is_bit_exact_in_any_order(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    state = _random_state(4)
    store.save_states([1, 4, 7, 10], state, round_id=3, attempt=1)
    _assert_state_equal(store.load_states([1, 4, 7, 10]), state)
    _assert_state_equal(store.load_states([10, 1]), state.select([3, 0]))
    progress = store.progress([1, 10])
    assert progress[1].last_round == 3 and progress[10].last_attempt == 1


def test_state_survives_reopening_the_file(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    state = _random_state(4, seed=9)
    store.save_states([1, 4, 7, 10], state, round_id=2, attempt=0)
    store.set_meta(token="tok", run_id="r1")
    store.close()
    again = WorkerStore(tmp_path / "w.db")
    _assert_state_equal(again.load_states([1, 4, 7, 10]), state)
    assert again.get_meta("token") == "tok" and again.get_meta("run_id") == "r1"
    assert again.user_ids().tolist() == [1, 4, 7, 10]


def test_saving_some_users_leaves_the_others_untouched(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    before = _random_state(4, seed=1)
    store.save_states([1, 4, 7, 10], before, None, None)
    store.save_states([7], _random_state(1, seed=2), round_id=1, attempt=0)
    _assert_state_equal(store.load_states([1, 4, 10]), before.select([0, 1, 3]))
    assert store.progress([4])[4].last_round is None


def test_interactions_round_trip(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    data = store.load_data()
    users = [1, 4, 7, 10]
    assert data.user_ids.tolist() == users
    for i, u in enumerate(users):
        assert np.array_equal(data.train[i], split.user_train(u))
    assert np.array_equal(data.test_items, split.test_items[users])
    assert np.array_equal(data.test_negatives, split.test_negatives[users])
    assert data.val_items is not None and data.val_negatives is not None
    assert split.val_items is not None and split.val_negatives is not None
    assert np.array_equal(data.val_items, split.val_items[users])
    assert np.array_equal(data.val_negatives, split.val_negatives[users])


def test_blobs_on_disk_are_safetensors_not_pickle(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    store.save_states([1, 4, 7, 10], _random_state(4), 1, 0)
    with store.engine.connect() as conn:
        rows = conn.execute(UserRow.__table__.select()).all()
    for row in rows:
        for blob in (row.state, row.interactions):
            assert not blob.startswith(b"\x80")  # pickle protocol marker
            tensors = st_load(blob)  # parses as safetensors
            assert tensors


def test_private_blob_codec_checks_its_format() -> None:
    state = _random_state(2)
    blobs = [encode_private(state, i) for i in range(2)]
    _assert_state_equal(decode_private(blobs, state.step.tolist()), state)
    from fedrecgel.wire import encode_state

    with pytest.raises(store_module.StoreError, match="format"):
        decode_private([encode_state({"x": torch.zeros(1)})], [0])


def test_rows_encoded_together_are_the_bytes_of_each_row_encoded_alone() -> None:
    state = _random_state(5, seed=7)
    state.step[:] = torch.tensor([3, 10, 3, 0, 123456])  # header lengths differ by step
    state.params["user_gmf"][1, 0] = -0.0
    state.exp_avg["user_mlp"][2, 1] = float("nan")
    alone = [encode_private(state, i) for i in range(5)]
    assert encode_private_rows(state) == alone
    assert encode_private_rows(state, 2) == alone[:2]


def test_loading_a_user_without_state_fails_clearly(tmp_path: Path, split: Split) -> None:
    store = _store(tmp_path, split)
    with pytest.raises(store_module.StoreError, match="no private state"):
        store.load_states([1])
    store.save_states([1, 4, 7, 10], _random_state(4), None, None)
    with pytest.raises(store_module.StoreError, match="not in this store"):
        store.load_states([2])


def test_a_mirrored_store_loads_what_the_file_holds(tmp_path: Path, split: Split) -> None:
    """The in-memory mirror serves the committed states bit for bit: after saves of some
    users, whatever the order asked, and as a plain store on the same file reads them."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4, 7, 10])
    with pytest.raises(store_module.StoreError, match="no private state"):
        store.load_states([1])  # no mirror before every user has a state
    first = _random_state(4, seed=3)
    store.save_states([1, 4, 7, 10], first, None, None)
    loaded = store.load_states([10, 1])  # builds the mirror from the file
    _assert_state_equal(loaded, first.select([3, 0]))
    loaded.params["user_gmf"].add_(1.0)  # a copy: the mirror is not changed through it
    store.save_states([7, 4], _random_state(2, seed=4), 2, 0)
    plain = WorkerStore(tmp_path / "w.db")
    for users in ([1, 4, 7, 10], [7], [10, 4, 1]):
        _assert_state_equal(store.load_states(users), plain.load_states(users))
    with pytest.raises(store_module.StoreError, match="not in this store"):
        store.load_states([1, 2])
    plain.close()
    store.close()


def test_a_new_run_of_another_model_shape_replaces_the_mirrored_states(
    tmp_path: Path, split: Split
) -> None:
    """Regression: a run with another factor (or kind) than the previous one crashed every
    mirroring worker (the mirror of the old widths could not take the new states)."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4])
    store.save_states([1, 4], _random_state(2, seed=5), None, None)
    store.load_states([1])  # mirror built, factor 4
    cfg = ModelConfig(n_items=40, kind="mf", factor=8)
    fresh = PrivateState.fresh(cfg, 0, np.array([1, 4]))
    store.reset_states([1, 4], fresh)
    _assert_state_equal(store.load_states([1, 4]), fresh)
    plain = WorkerStore(tmp_path / "w.db")
    _assert_state_equal(plain.load_states([4, 1]), fresh.select([1, 0]))
    plain.close()
    store.close()


def test_a_failed_save_leaves_the_mirror_as_the_file(tmp_path: Path, split: Split) -> None:
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4])
    before = _random_state(2, seed=5)
    store.save_states([1, 4], before, None, None)
    store.load_states([1])  # mirror built
    with pytest.raises(StaleDataError):  # no row of user 99: the transaction rolls back
        store.save_states([1, 4, 99], _random_state(3, seed=6), 1, 0)
    _assert_state_equal(store.load_states([1, 4]), before)
    store.close()


def test_a_save_committing_while_the_mirror_is_built_reaches_the_mirror(
    tmp_path: Path, split: Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device API's thread builds the mirror while the worker's thread saves: the save
    commits after the build read the file and before it set the mirror. Its states must be
    in the mirror (the build holds the lock from its read to the assignment, so the save
    waits and writes into the new mirror), never the states read before it."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4])
    store.save_states([1, 4], _random_state(2, seed=7), None, None)
    newer = _random_state(2, seed=8)
    read_done, save_done = threading.Event(), threading.Event()
    builder_reads: list[Sequence[int]] = []
    real_read, real_saved = store._load_from_db, store._mirror_saved

    def read_then_let_the_save_in(user_ids: Sequence[int]) -> PrivateState:
        state = real_read(user_ids)
        if threading.current_thread().name == "builder" and not builder_reads:
            builder_reads.append(user_ids)
            read_done.set()
            # the save commits and writes to the mirror now, unless the lock holds it back
            # (then this waits in vain, and the save goes on once the mirror is set)
            save_done.wait(timeout=1.0)
        return state

    def saved(user_ids: Sequence[int], state: PrivateState) -> None:
        real_saved(user_ids, state)
        save_done.set()

    monkeypatch.setattr(store, "_load_from_db", read_then_let_the_save_in)
    monkeypatch.setattr(store, "_mirror_saved", saved)
    built = []
    builder = threading.Thread(
        target=lambda: built.append(store.load_states([1, 4])), name="builder"
    )
    builder.start()
    assert read_done.wait(timeout=30)
    store.save_states([1, 4], newer, 1, 0)  # the worker's thread
    builder.join(timeout=30)
    assert builder_reads and built
    _assert_state_equal(store.load_states([1, 4]), newer)
    store.close()


def test_a_mirrored_store_answers_progress_from_memory(tmp_path: Path, split: Split) -> None:
    """Each round's cohort check reads the members' committed (round, attempt): a mirroring
    store reads the file once, then answers without a query, as the file says after saves
    and resets (a failed save changes nothing)."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4, 7])
    store.save_states([1, 4, 7], _random_state(3, seed=9), None, None)
    queries: list[str] = []
    sqlalchemy.event.listen(
        store.engine, "before_cursor_execute", lambda *a: queries.append(str(a[2]))
    )
    assert store.progress([1, 4]) == {1: Progress(None, None), 4: Progress(None, None)}
    store.save_states([4, 7], _random_state(2, seed=10), 3, 1)
    with pytest.raises(StaleDataError):
        store.save_states([1, 99], _random_state(2, seed=11), 5, 0)
    queries.clear()
    got = store.progress([7, 4, 1])
    assert queries == [], queries
    plain = WorkerStore(tmp_path / "w.db")
    assert (
        got
        == plain.progress([1, 4, 7])
        == {
            1: Progress(None, None),
            4: Progress(3, 1),
            7: Progress(3, 1),
        }
    )
    assert store.progress([4, 2]) == {4: Progress(3, 1)}  # 2 is not a user: asks the file
    plain.close()
    store.close()


def test_worker_modules_never_pickle_or_torch_load() -> None:
    for mod in (store_module, client_module, worker_module):
        src = inspect.getsource(mod)
        assert "import pickle" not in src and "torch.load" not in src, mod.__name__


def test_aggregator_client_takes_no_private_state() -> None:
    """The client's public surface has no parameter that could carry private state."""
    client_cls = client_module.AggregatorClient
    for name, fn in inspect.getmembers(client_cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        for p in inspect.signature(fn).parameters.values():
            ann = str(p.annotation)
            assert "PrivateState" not in ann and "UserData" not in ann, (name, p.name)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_store_and_its_sqlite_files_are_private(tmp_path: Path, split: Split) -> None:
    import os

    old = os.umask(0o022)  # the usual umask: files 0644 unless created otherwise
    try:
        path = tmp_path / "worker.db"
        store = WorkerStore(path)
        store.add_users(split, [0, 2, 4])
        store.set_meta(token="client-token")
        store.save_states([0, 2], _random_state(2), 1, 0)
        companions = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
        assert all(p.exists() for p in companions)  # WAL mode: both exist while it is open
        assert [_mode(p) for p in (path, *companions)] == [0o600] * 3
        store.close()
        # a store left readable by an older version is narrowed when it is opened again
        path.chmod(0o644)
        reopened = WorkerStore(f"sqlite:///{path}")
        assert _mode(path) == 0o600 and reopened.get_meta("token") == "client-token"
        reopened.close()
    finally:
        os.umask(old)


def test_another_services_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    # e.g. --store pointed at the aggregator's database by mistake: no table is added to it
    from sqlalchemy import create_engine
    from sqlalchemy import inspect as sql_inspect

    from services.aggregator.db import Database
    from services.client_sim.store import StoreError

    path = tmp_path / "aggregator.db"
    Database(f"sqlite:///{path}").migrate()
    engine = create_engine(f"sqlite:///{path}")
    path.chmod(0o640)
    before = set(sql_inspect(engine).get_table_names())
    with pytest.raises(StoreError, match="is not a worker store"):
        WorkerStore(path)
    assert set(sql_inspect(engine).get_table_names()) == before
    assert path.stat().st_mode & 0o777 == 0o640  # nor its mode
    engine.dispose()


def test_a_mirroring_store_reads_its_meta_from_memory_and_writes_it_through(
    tmp_path: Path, split: Split
) -> None:
    """The worker's store (``mirror=True``) loads the meta table once; reads then cost no
    query, writes still commit first, and the file holds what the copy says."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.set_meta(run_id="r1", evaluated_version=3, **{"report/4": "{}", "report/5": "{}"})
    queries: list[str] = []
    sqlalchemy.event.listen(store.engine, "before_cursor_execute", lambda *a: queries.append(a[2]))
    assert store.get_meta("run_id") == "r1"  # the first read loads the table
    loaded = len(queries)
    for _ in range(5):
        assert store.get_meta("evaluated_version") == "3"
        assert store.get_meta("absent") is None
        assert store.meta_like("report/") == {"report/4": "{}", "report/5": "{}"}
    assert len(queries) == loaded == 1
    store.set_meta(evaluated_version=5, **{"report/4": None})
    assert store.get_meta("evaluated_version") == "5"
    assert store.meta_like("report/") == {"report/5": "{}"}
    store.close()
    again = WorkerStore(tmp_path / "w.db")  # not mirroring: straight from the file
    assert again.get_meta("evaluated_version") == "5" and again.get_meta("run_id") == "r1"
    assert again.meta_like("report/") == {"report/5": "{}"}


def test_a_reset_of_every_owned_user_is_the_mirror_without_a_read(
    tmp_path: Path, split: Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new run's reset of all owned users (in id order) fills the mirror from the committed
    states themselves: no blob is decoded to serve them, and they are what the file holds. A
    reset of some users only leaves the mirror to be rebuilt from the file."""
    store = WorkerStore(tmp_path / "w.db", mirror=True)
    store.add_users(split, [1, 4, 7])
    cfg = ModelConfig(n_items=40, factor=4, layers=2)
    fresh = PrivateState.fresh(cfg, 3, np.array([1, 4, 7]))
    store.reset_states([1, 4, 7], fresh)
    real_read = store._load_from_db

    def no_read(user_ids: Sequence[int]) -> None:
        raise AssertionError("read from the file")

    monkeypatch.setattr(store, "_load_from_db", no_read)
    loaded = store.load_states([7, 1])
    _assert_state_equal(loaded, fresh.select([2, 0]))
    fresh.params["user_gmf"].add_(1.0)  # the caller's tensors are not the mirror's
    plain = WorkerStore(tmp_path / "w.db")
    _assert_state_equal(store.load_states([1, 4, 7]), plain.load_states([1, 4, 7]))
    monkeypatch.setattr(store, "_load_from_db", real_read)
    store.reset_states([4], PrivateState.fresh(cfg, 5, np.array([4])))
    _assert_state_equal(store.load_states([1, 4, 7]), plain.load_states([1, 4, 7]))
    plain.close()
    store.close()
