"""`fedrec up` cannot hurt its neighbours: busy ports are named before anything starts, a second
instance on the same work directory is refused without touching it, and SIGTERM, SIGHUP or the
death of the launcher leave no child process behind (also when SIGINT is ignored, as for a
background job of a script)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.procs import alive, descendants, fedrec_up_on, spawned, wait_for_text
from services.restarts import Proc
from services.supervise import Stopped, locked_workdir, stop_on_signals
from tests.support.loopback import bindable, free_port


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ports() -> tuple[int, int, int]:
    """Free aggregator, recommend_api and first worker ports (the second worker's is +1)."""
    return free_port(), free_port(), free_port(2)


WIDE = {**os.environ, "COLUMNS": "500"}  # messages on one line


def _run(args: list[str], log_path: Path, timeout_s: float = 120) -> tuple[int, str]:
    """Run a command to its end (killed with everything it started at the end)."""
    with log_path.open("w") as log, spawned(args, log, env=WIDE) as proc:
        code = proc.wait(timeout_s)
    return code, log_path.read_text()


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A socket listening on a free loopback port (a neighbour's server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


@pytest.mark.parametrize("which", ["aggregator", "recommendation API", "worker-1"])
def test_a_busy_port_is_named_before_anything_starts(
    tmp_path: Path, listening: socket.socket, which: str
) -> None:
    busy = listening.getsockname()[1]
    agg, rec, http0 = _ports()
    if which == "aggregator":
        agg = busy
    elif which == "recommendation API":
        rec = busy
    else:
        http0 = busy - 1
    workdir = tmp_path / "up"
    code, out = _run(fedrec_up_on(workdir, (agg, rec, http0)), tmp_path / "up.log")
    assert code == 2, out
    assert f"port {busy} ({which}" in out, out
    assert "Traceback" not in out
    # nothing was started: no log, no database
    assert sorted(p.name for p in workdir.iterdir()) == ["fedrec-up.lock"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:{port}", "--redis-url: Redis does not answer: Error 111"),
        ("redis://127.0.0.1:notaport", "--redis-url is not a Redis URL: Port could not be cast"),
    ],
)
def test_a_redis_url_that_cannot_be_used_is_named_before_anything_starts(
    tmp_path: Path, url: str, message: str
) -> None:
    workdir = tmp_path / "up"
    args = fedrec_up_on(workdir, _ports(), "--redis-url", url.format(port=free_port()))
    code, out = _run(args, tmp_path / "up.log")
    assert code == 2, out
    assert message in out and "Traceback" not in out, out
    assert sorted(p.name for p in workdir.iterdir()) == ["fedrec-up.lock"]


def test_a_service_that_exits_is_reported_with_the_line_that_says_why(tmp_path: Path) -> None:
    log = tmp_path / "aggregator.log"
    log.write_text(
        "INFO:     Started server process [1]\n"
        "ERROR:    Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "    connect()\n"
        "ValueError: Port could not be cast to integer value as 'x'\n"
        "\n"
        "ERROR:    Application startup failed. Exiting.\n"
    )
    # no log file: None leaves the output on the test's own (subprocess.Popen takes it)
    with spawned([sys.executable, "-c", "raise SystemExit(3)"], None) as popen:  # type: ignore[arg-type]
        code = popen.wait(60)
        error = str(Proc("aggregator", popen, log).exited(code))
    assert error == (
        "aggregator exited with code 3: ValueError: Port could not be cast to integer value "
        f"as 'x'; see {log}"
    )


def test_a_second_instance_is_refused_without_touching_the_first_workdir(tmp_path: Path) -> None:
    """Another process (this test) holds the work directory: `fedrec up` refuses, naming it,
    and leaves every file there as it was."""
    workdir = tmp_path / "demo"
    workdir.mkdir()
    files = {"aggregator.db": b"the first's database", "worker-0.db": b"store", "x.log": b"log"}
    for name, data in files.items():
        (workdir / name).write_bytes(data)
    with locked_workdir(workdir):
        before = {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()}
        code, out = _run(fedrec_up_on(workdir, _ports()), tmp_path / "up.log")
        assert code == 2, out
        assert f"work directory {workdir} is in use" in out and f"pid {os.getpid()}" in out, out
        assert "Traceback" not in out
        for name, data in files.items():
            assert (workdir / name).read_bytes() == data
        assert {p.name: p.stat().st_mtime_ns for p in workdir.iterdir()} == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_raise_stopped_like_ctrl_c(sig: signal.Signals) -> None:
    previous = signal.getsignal(sig)
    with pytest.raises(Stopped) as info, stop_on_signals():
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler interrupts this
    assert info.value.signum == sig and info.value.name == sig.name
    assert signal.getsignal(sig) == previous


@pytest.mark.slow
def test_running_instance_is_safe_from_a_second_one_and_sigterm_stops_everything(
    tmp_path: Path,
) -> None:
    """A real instance trains (SIGINT ignored, as a background job of a script): a second one
    on its work directory and a third on its ports are refused and change nothing; SIGTERM then
    stops it and every process it started."""
    ports = _ports()
    workdir = tmp_path / "demo"
    log_path = tmp_path / "first.log"
    with (
        log_path.open("w") as log,
        spawned(
            fedrec_up_on(workdir, ports, "--rounds", "20"), log, env=WIDE, preexec_fn=_ignore_sigint
        ) as first,
    ):
        wait_for_text(log_path, "clients registered", first, timeout_s=300)
        children = descendants(first.pid)
        assert len(children) >= 4, children  # aggregator, recommend_api, two workers
        db = workdir / "aggregator.db"
        inode, logs = db.stat().st_ino, sorted(p.name for p in workdir.glob("*.log"))

        code, out = _run(fedrec_up_on(workdir, _ports()), tmp_path / "second.log")
        assert code == 2 and f"pid {first.pid}" in out and "Traceback" not in out, out
        code, out = _run(fedrec_up_on(tmp_path / "third", ports), tmp_path / "third.log")
        assert code == 2 and f"port {ports[0]} (aggregator" in out, out

        assert db.stat().st_ino == inode and db.stat().st_size > 0
        assert sorted(p.name for p in workdir.glob("*.log")) == logs
        agg = f"http://127.0.0.1:{ports[0]}"
        assert httpx.get(f"{agg}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{agg}/v1/clients/count", timeout=10).json()["registered"] > 0

        first.send_signal(signal.SIGINT)  # ignored: nothing happens
        time.sleep(1.0)
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        code = first.wait(60)
    text = log_path.read_text()
    assert code == 128 + signal.SIGTERM, text
    assert "stopped by SIGTERM" in text and "Traceback" not in text
    assert [pid for pid in children if alive(pid)] == []
    for port in (ports[0], ports[1], ports[2], ports[2] + 1):
        assert bindable(port), port


@pytest.mark.slow
def test_children_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL cannot be caught: the children still go, as the kernel signals them."""
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log, spawned(fedrec_up_on(tmp_path / "w", _ports()), log) as proc:
        wait_for_text(log_path, "aggregator up", proc, timeout_s=300)
        children = descendants(proc.pid)
        assert children
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pid for pid in children if alive(pid)] == []


def test_the_commands_to_try_print_whole_on_a_narrow_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each command is one line a user can paste, also when the output is not a wide terminal
    import io
    from types import SimpleNamespace

    from rich.console import Console

    import services.up as up_module

    out = io.StringIO()
    monkeypatch.setattr(up_module, "console", Console(file=out, width=40))
    agg = "http://127.0.0.1:8700"
    c = SimpleNamespace(
        agg_url=agg, rec_url="http://127.0.0.1:8702", dashboard_url="http://127.0.0.1:8704/ui/"
    )
    opts = SimpleNamespace(host="127.0.0.1", worker_http_port=8710, dashboard=True, recommend=True)
    token = tmp_path / "operator.token"
    up_module._print_try_it(c, opts, token)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    want = (
        f'  curl -s -H "Authorization: Bearer $(cat {token})" {agg}/v1/models/latest '
        "-o model.safetensors"
    )
    assert want in lines, lines
    assert "  curl -s 'http://127.0.0.1:8710/v1/users/0/recommendations?k=5'" in lines


def test_a_worker_count_past_what_one_machine_holds_is_refused_before_starting(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from services.cli import MAX_UP_WORKERS, app

    workdir = tmp_path / "up"
    r = CliRunner().invoke(app, ["up", "--workers", "5000", "--workdir", str(workdir)])
    assert r.exit_code == 2, r.output
    assert f"less than or equal to {MAX_UP_WORKERS}" in r.output
    assert not workdir.exists()  # nothing was started


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "--database-url: not a database URL"),
        ("mysql+nodriver://h/db", "--database-url: no database driver for 'mysql+nodriver'"),
        (
            "postgresql+psycopg://fedrec@127.0.0.1:{port}/fedrec",
            "--database-url: the database does not answer: ",
        ),
    ],
)
def test_a_database_url_that_cannot_be_used_is_named_before_anything_starts(
    tmp_path: Path, url: str, message: str
) -> None:
    workdir = tmp_path / "up"
    args = fedrec_up_on(workdir, _ports(), "--database-url", url.format(port=free_port()))
    code, out = _run(args, tmp_path / "up.log")
    assert code == 2, out
    assert message in out and "Traceback" not in out, out
    # nothing was started: no log, no database
    assert sorted(p.name for p in workdir.iterdir()) == ["fedrec-up.lock"]


def test_clearing_a_work_directory_removes_only_the_launchers_own_files(tmp_path: Path) -> None:
    from services.supervise import clear_workdir

    own = ["aggregator.db", "aggregator.db-wal", "worker-0.db", "worker-12.db-shm"]
    own += ["aggregator.log", "worker-3.log", "recommend_api.log", "dashboard.log"]
    own += ["operator.token"]
    others = ["build.log", "notes.log", "aggregator.db.bak", "worker-x.db", "my-worker-0.db"]
    for name in own + others:
        (tmp_path / name).write_text("x")
    (tmp_path / "archive.log").mkdir()  # a folder that happens to match a pattern
    (tmp_path / "archive.log" / "kept.txt").write_text("x")
    clear_workdir(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*others, "archive.log"])
    assert (tmp_path / "archive.log" / "kept.txt").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["--secure-aggregation", "dense", "--dp-noise", "1"], "not supported: choose one"),
        (["--secure-aggregation", "dense", "--fraction", "0.0001"], "at least 2 clients"),
        (["--dp-noise", "0.1", "--target-epsilon", "0.001"], "target_epsilon"),
    ],
)
def test_run_settings_the_aggregator_refuses_are_named_before_anything_starts(
    tmp_path: Path, settings: list[str], message: str
) -> None:
    """These used to start every service and register every user, then fail at the start
    of the run."""
    workdir = tmp_path / "up"
    code, out = _run(fedrec_up_on(workdir, _ports(), *settings), tmp_path / "up.log")
    assert code == 2, out
    assert "the run settings are refused" in out and message in out, out
    assert "aggregator up" not in out and "Traceback" not in out, out
    assert sorted(p.name for p in workdir.iterdir()) == ["fedrec-up.lock"]


def test_files_of_the_launchers_names_that_no_launcher_wrote_are_refused(tmp_path: Path) -> None:
    """`fedrec up --workdir .` where `fedrec aggregator` had made ./aggregator.db (its default
    database) deleted that database; files in a folder an earlier `fedrec up` used are its own
    and replaced as before."""
    from services.launcher import UpOptions
    from services.supervise import LaunchError, check_workdir
    from services.up import up

    (tmp_path / "aggregator.db").write_bytes(b"a run of its own")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(LaunchError) as refused:
        up(UpOptions(workdir=tmp_path))
    assert f"work directory {tmp_path} holds aggregator.db, which no `fedrec up` wrote" in str(
        refused.value
    )
    assert (tmp_path / "aggregator.db").read_bytes() == b"a run of its own"
    assert not (tmp_path / "fedrec-up.lock").exists()  # a second try is refused as well
    launched = tmp_path / "launched"
    launched.mkdir()
    (launched / "aggregator.db").write_bytes(b"an earlier launcher's")
    (launched / "fedrec-up.lock").write_text("1\n")
    check_workdir(launched, launchers=True)  # no refusal: the launcher replaces its own files
