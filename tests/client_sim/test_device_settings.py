"""The worker's HTTP and shard options: flags, environment, the StatefulSet hostname ordinal,
and the item labels it sends to recommend_api."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrecgel.data import Split
from services.client_sim.cli import settings_from_args
from services.client_sim.server import item_labels, user_labels
from services.client_sim.settings import WorkerSettings, hostname_ordinal
from tests.client_sim.device_api import (
    DEVICE_TOKEN,
    device_split,
    settings_for,
)


@pytest.fixture(scope="module")
def split() -> Split:
    return device_split()


def test_item_and_user_labels_follow_the_recommend_item_ids_setting(
    tmp_path: Path, split: Split
) -> None:
    assert item_labels(settings_for(tmp_path, recommend_item_ids="index"), split) is None
    labels = item_labels(settings_for(tmp_path), split)
    assert labels == [str(x) for x in split.item_labels.tolist()]
    # users likewise: the data's ids, or (index) none, their numbers in decimal standing in
    assert user_labels(settings_for(tmp_path, recommend_item_ids="index"), split) is None
    users = user_labels(settings_for(tmp_path), split)
    assert users == [str(x) for x in split.user_labels.tolist()]


def test_http_options_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_WORKER_HTTP_PORT", "8710")
    monkeypatch.setenv("FEDREC_WORKER_RECOMMEND_URL", "http://rec:8702")
    monkeypatch.setenv("FEDREC_WORKER_DEVICE_TOKEN", DEVICE_TOKEN)
    s = settings_from_args(["--http-host", "0.0.0.0"])
    assert (s.http_port, s.http_host, s.recommend_url) == (8710, "0.0.0.0", "http://rec:8702")
    s = settings_from_args(["--http-port", "9000", "--recommend-item-ids", "index"])
    assert s.http_port == 9000 and s.recommend_item_ids == "index"
    monkeypatch.delenv("FEDREC_WORKER_HTTP_PORT")
    assert WorkerSettings().http_port is None  # off by default
    with pytest.raises(ValueError):
        WorkerSettings(http_port=70000)


@pytest.mark.parametrize(
    ("hostname", "shard"),
    [("worker-0", 0), ("fedrec-worker-12", 12), ("worker-3.worker.fedrec.svc.cluster.local", 3)],
)
def test_shard_from_hostname_reads_the_statefulset_ordinal(hostname: str, shard: int) -> None:
    assert hostname_ordinal(hostname) == shard


@pytest.mark.parametrize("hostname", ["worker", "3f2a9c1b7d4e", "worker-", "worker-1a"])
def test_hostname_without_an_ordinal_is_refused(hostname: str) -> None:
    with pytest.raises(ValueError, match="ordinal"):
        hostname_ordinal(hostname)


def test_shard_from_hostname_setting_overrides_shard_and_names_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "worker-2")
    s = WorkerSettings(shard_from_hostname=True, shards=4, store="/data/worker-{shard}.db")
    assert s.shard == 2 and s.store == "/data/worker-2.db"
    with pytest.raises(ValueError, match="shard"):
        WorkerSettings(shard_from_hostname=True, shards=2)  # ordinal 2 of 2 shards
    monkeypatch.setenv("FEDREC_WORKER_SHARD_FROM_HOSTNAME", "true")
    monkeypatch.setenv("FEDREC_WORKER_SHARDS", "3")
    assert settings_from_args([]).shard == 2
