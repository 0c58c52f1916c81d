"""The worker's command line and settings, and the Redis wake-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.client_sim import cli
from services.client_sim.cli import main, settings_from_args
from services.client_sim.settings import WorkerSettings
from services.client_sim.waiters import RedisWaiter


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_WORKER_SHARDS", "4")
    monkeypatch.setenv("FEDREC_WORKER_STORE", "from-env.db")
    monkeypatch.setenv("FEDREC_WORKER_REDIS_URL", "redis://127.0.0.1:6379/0")
    s = settings_from_args(
        [
            "--aggregator",
            "http://h:1",
            "--shard",
            "3",
            "--store",
            "w3.db",
            "--no-exit-when-finished",
        ]
    )
    assert (s.aggregator, s.shard, s.shards, s.store) == ("http://h:1", 3, 4, "w3.db")
    assert s.redis_url == "redis://127.0.0.1:6379/0" and s.exit_when_finished is False
    assert s.dataset == "filmtrust" and s.validation is True  # the default, as fedrec train


def test_bad_shard_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--shard", "2", "--shards", "2"]) == 2
    assert "shard" in capsys.readouterr().err


def test_module_entry_point_prints_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.client_sim", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--aggregator", "--shard", "--shards", "--dataset", "--store", "--redis-url"):
        assert flag in out


def test_settings_validate_poll_intervals() -> None:
    with pytest.raises(ValueError, match="poll"):
        WorkerSettings(poll_min_s=2.0, poll_max_s=1.0)


@pytest.mark.redis
def test_redis_waiter_wakes_up_on_a_version_event(redis_url: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    waiter = RedisWaiter(redis_url)
    try:
        t0 = time.monotonic()
        waiter.wait(0.2)  # nothing published: waits the whole timeout
        assert time.monotonic() - t0 >= 0.19
        timer = threading.Timer(
            0.1, lambda: r.publish("fedrec:versions", '{"run_id": 1, "version": 1}')
        )
        timer.start()
        t0 = time.monotonic()
        waiter.wait(10.0)
        assert time.monotonic() - t0 < 5.0
    finally:
        waiter.close()
        r.close()


def test_an_unusable_store_or_dataset_is_an_error_line_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    base = ["--aggregator", "http://127.0.0.1:9", "--shard", "0", "--shards", "2"]
    for args, message in (
        (["--store", str(blocker / "w.db")], f"cannot open the store {blocker / 'w.db'}"),
        (["--store", str(tmp_path / "w.db"), "--dataset", "nope"], "unknown dataset 'nope'"),
        (["--store", "nonsense://u:hunter2@h/d"], "cannot open the store nonsense://u:***@h/d"),
        (["--store", str(blocker)], "file is not a database"),
        (["--store", str(tmp_path)], "unable to open database file"),
    ):
        caplog.clear()
        assert main([*base, *args]) == 1, args
        assert message in caplog.text, caplog.text
        assert "hunter2" not in caplog.text and "Traceback" not in caplog.text
    assert blocker.read_text() == "not a folder"


def test_a_mistyped_redis_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--shard", "0", "--shards", "1", "--redis-url", "localhost:6379"]
    assert main(args) == 2
    assert "a Redis URL starts with redis://" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--timeout-s", "-1", "--timeout-s (FEDREC_WORKER_TIMEOUT_S): must be more than 0"),
        ("--timeout-s", "inf", "--timeout-s (FEDREC_WORKER_TIMEOUT_S): must be a finite"),
        ("--poll-min-s", "nan", "--poll-min-s (FEDREC_WORKER_POLL_MIN_S): must be a finite"),
        ("--retries", "-5", "--retries (FEDREC_WORKER_RETRIES): must be at least 0, got -5"),
        ("--torch-threads", "100000", "(FEDREC_WORKER_TORCH_THREADS): must be at most 1024"),
        ("--max-body-bytes", "0", "(FEDREC_WORKER_MAX_BODY_BYTES): must be at least 1024"),
        ("--log-level", "nope", "log_level"),
        ("--aggregator", "notaurl", "http://"),
        ("--recommend-url", "http://", "host"),
    ],
)
def test_unusable_flag_values_are_usage_errors_not_tracebacks_or_endless_retries(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    """Each of these was taken as given: a traceback at the first request or wait
    (negative timeout, NaN poll, negative retries), or retries without end (a URL without
    its scheme)."""
    assert main(["--shard", "0", "--shards", "1", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_the_help_shows_the_settings_defaults_and_shards_get_their_own_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The help's defaults were typed by hand beside the settings'; the default store was
    worker-0.db for every shard, so a second worker started without --store met the first's
    store (refused: it holds shard=0)."""
    from services.client_sim.cli import HELP

    assert main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for field in HELP:
        default = WorkerSettings.model_fields[field].default
        assert f"FEDREC_WORKER_{field.upper()}" in shown, field
        if default is not None and not isinstance(default, bool):
            assert f"; default {default})" in shown, field
    assert "(FEDREC_WORKER_STORE; default worker-{shard}.db)" in shown
    assert "--validation / --no-validation" in shown
    stores = {WorkerSettings(shard=i, shards=2).store for i in range(2)}
    assert stores == {"worker-0.db", "worker-1.db"}


def test_a_signal_while_the_worker_stops_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM stops the worker as Ctrl-C does; one more signal while it stopped (closing its
    store) raised a KeyboardInterrupt inside SQLAlchemy's close, printed as a traceback. The
    first stops it, the others are ignored, and the handlers are given back after."""
    raised: list[str] = []

    def run(settings: object) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # interrupted by the signal's KeyboardInterrupt
        finally:  # the clean-up, where the second signal arrives
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
            except KeyboardInterrupt as err:
                raised.append(str(err))

    monkeypatch.setattr(cli, "run_worker", run)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["--store", str(tmp_path / "w.db")]) == 130
    assert raised == []
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
