"""A worker registers its shard's users with the shard's enrolment token: the token must name
its own shard, a refusal is a message (never a traceback), a worker that died before keeping
its client token registers again under the token it chose, and no other worker takes them."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from fedrecgel.data import Split
from fedrecgel.synthetic import synthetic_split
from services.client_sim.cli import main as worker_main
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.worker import Worker
from services.enrolment import enrolment_token
from tests.client_sim.conftest import LiveAggregator
from tests.fake_aggregator import FakeAggregator, enrolment_for, worker_settings
from tests.support.aggregator import ENROLMENT_SECRET, OPERATOR_TOKEN

N_USERS = 12


@pytest.fixture(scope="module")
def split() -> Split:
    return synthetic_split(n_users=N_USERS, n_items=30, seed=3, n_test_negatives=10)


def _settings(tmp_path: Path, **kw: Any) -> WorkerSettings:
    return worker_settings(tmp_path, enrol=False, **{"shard": 1, "retries": 0, **kw})


def test_the_token_must_name_the_workers_own_shard(tmp_path: Path) -> None:
    ok = _settings(tmp_path, enrolment_token=enrolment_for(1, 2))
    assert ok.enrolment_token is not None
    for shard, shards in ((0, 2), (1, 3)):
        with pytest.raises(ValidationError, match=f"enrols shard {shard} of {shards}"):
            _settings(tmp_path, enrolment_token=enrolment_for(shard, shards))
    with pytest.raises(ValidationError, match="not an enrolment token"):
        _settings(tmp_path, enrolment_token="REPLACE_ME")


def test_the_token_file_may_name_the_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(2):
        (tmp_path / f"shard-{i}.token").write_text(enrolment_for(i, 2) + "\n")
    monkeypatch.setattr("socket.gethostname", lambda: "worker-1")  # a StatefulSet pod
    s = _settings(
        tmp_path,
        shard_from_hostname=True,
        enrolment_token_file=tmp_path / "shard-{shard}.token",
    )
    assert s.enrolment_token is not None
    assert s.enrolment_token.get_secret_value() == enrolment_for(1, 2)


def test_a_token_of_another_shard_ends_the_worker_with_a_message(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "FEDREC_WORKER_ENROLMENT_TOKEN": enrolment_for(0, 2)}
    flags = ["--shard", "1", "--shards", "2", "--store", str(tmp_path / "w.db")]
    r = subprocess.run(
        [sys.executable, "-m", "services.client_sim", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "enrols shard 0 of 2, but this worker is shard 1 of 2" in r.stderr
    assert "Traceback" not in r.stderr


def test_registration_sends_the_enrolment_token_and_keeps_the_client_token(
    tmp_path: Path, split: Split
) -> None:
    fake = FakeAggregator()
    w = Worker(
        _settings(tmp_path, enrolment_token=enrolment_for(1, 2)),
        split=split,
        transport=fake.transport(),
    )
    w.register()
    sent = fake.requests[0]
    assert sent.path == "/v1/clients"
    assert sent.headers["authorization"] == f"Bearer {enrolment_for(1, 2)}"
    assert sorted(fake.registered) == list(range(1, N_USERS, 2))
    assert w.store.get_meta("token") == fake.registered[1]
    w.close()


def test_without_a_token_registration_is_not_tried(tmp_path: Path, split: Split) -> None:
    fake = FakeAggregator()
    w = Worker(_settings(tmp_path), split=split, transport=fake.transport())
    with pytest.raises(WorkerError, match="FEDREC_WORKER_ENROLMENT_TOKEN"):
        w.register()
    assert fake.requests == []
    w.close()


@pytest.mark.parametrize(
    ("overrides", "token_secret", "status", "hint"),
    [
        ({"population": None}, ENROLMENT_SECRET, "409 no_population", "FEDREC_AGG_POPULATION"),
        ({"population": 5}, ENROLMENT_SECRET, "403 not_your_ids", "population"),
        ({}, "another-deployments-enrolment-secret", "401", "FEDREC_AGG_ENROLMENT_SECRET"),
    ],
)
def test_a_refused_registration_is_a_message_and_exit_status_1(
    tmp_path: Path,
    live_aggregator: LiveAggregator,
    caplog: pytest.LogCaptureFixture,
    overrides: dict[str, int | None],
    token_secret: str,
    status: str,
    hint: str,
) -> None:
    """The real aggregator refuses; `fedrec worker` logs why and what to change, and exits 1."""
    token = enrolment_token(token_secret, 1, 2)
    with live_aggregator(**overrides) as url:
        argv = ["--aggregator", url, "--shard", "1", "--shards", "2", "--dataset", "filmtrust"]
        argv += ["--store", str(tmp_path / "w.db"), "--retries", "0"]
        with (
            pytest.MonkeyPatch.context() as mp,
            caplog.at_level(logging.ERROR, logger="services.client_sim.cli"),
        ):
            mp.setenv("FEDREC_WORKER_ENROLMENT_TOKEN", token)
            assert worker_main(argv) == 1
    message = caplog.records[-1].getMessage()
    assert "refused to register" in message and status in message and hint in message
    assert caplog.records[-1].exc_info is None  # a message, not a traceback


def test_a_worker_that_died_before_keeping_its_token_registers_again(
    tmp_path: Path, live_aggregator: LiveAggregator, split: Split
) -> None:
    """The aggregator registered the users, the worker died before the answer reached its
    store: restarted, it asks again with the token it chose and kept, and gets it back."""
    with live_aggregator(population=N_USERS) as url:
        enrol = enrolment_token(ENROLMENT_SECRET, 1, 2)
        settings = _settings(tmp_path, aggregator=url, enrolment_token=enrol)
        crashed = Worker(settings, split=split)
        real_set_meta = crashed.store.set_meta

        def die_on_token(**values: str | int | None) -> None:
            if "token" in values:
                raise RuntimeError("killed before the token reached the store")
            real_set_meta(**values)

        crashed.store.set_meta = die_on_token  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="killed"):
            crashed.register()
        chosen = crashed.store.get_meta("registration_token")
        assert chosen is not None and crashed.store.get_meta("token") is None
        assert httpx.get(f"{url}/v1/clients/count").json() == {"registered": N_USERS // 2}
        crashed.close()
        restarted = Worker(settings, split=split)
        restarted.register()
        assert restarted.store.get_meta("token") == chosen
        assert restarted.store.get_meta("registration_token") is None
        assert restarted.client.current_round().state == "idle"  # the token works
        assert httpx.get(f"{url}/v1/clients/count").json() == {"registered": N_USERS // 2}
        restarted.close()
        # restarted again, on its kept token: no registration at all, still working
        again = Worker(settings, split=split)
        again.register()
        assert again.client.token == chosen and again.client.current_round().state == "idle"
        again.close()


def test_a_second_worker_of_the_shard_cannot_take_the_users(
    tmp_path: Path, live_aggregator: LiveAggregator, split: Split
) -> None:
    """A worker of the same shard on another store (or anyone holding the shard's enrolment
    token) is refused with a message; the running worker keeps its users. Once the operator
    releases them (the first worker's store is lost), a worker registers them again."""
    with live_aggregator(population=N_USERS) as url:
        enrol = enrolment_token(ENROLMENT_SECRET, 1, 2)
        first = Worker(_settings(tmp_path, aggregator=url, enrolment_token=enrol), split=split)
        first.register()
        held = first.store.get_meta("token")
        (tmp_path / "other").mkdir()
        other_settings = _settings(tmp_path / "other", aggregator=url, enrolment_token=enrol)
        other = Worker(other_settings, split=split)
        with pytest.raises(WorkerError) as refused:
            other.register()
        message = str(refused.value)
        assert "409 clients_held" in message and "POST /v1/clients/release" in message
        assert other.store.get_meta("token") is None
        assert first.client.current_round().state == "idle"  # still holds them
        other.close()
        # the first worker's store is lost: the operator releases its users
        released = httpx.post(
            f"{url}/v1/clients/release",
            json={"client_ids": first.users.tolist()},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        assert released.status_code == 200, released.text
        first.close()
        other = Worker(other_settings, split=split)
        other.register()
        assert other.client.current_round().state == "idle"
        old = httpx.get(f"{url}/v1/rounds/current", headers={"Authorization": f"Bearer {held}"})
        assert old.status_code == 401  # the lost token holds no client any more
        other.close()
