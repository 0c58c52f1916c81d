"""Shared fixtures: real redis-server and PostgreSQL processes started in temp dirs.

Both skip cleanly (with the reason) when the binaries are not installed:
``apt-get install -y redis-server postgresql``. A test that needs one is marked ``redis`` or
``postgres`` (a test that uses their fixtures is marked here), one that drives the system
Chromium ``browser`` (a module that uses :func:`harness.browser.chromium` is marked
here), one that puts Debian's haproxy in front of aggregator replicas ``haproxy``; each is
skipped before its fixtures are set up when what it needs is missing, so
``pytest -m "redis or postgres or browser or haproxy"`` on a bare machine skips them all, at once
(``scripts/test-without-services.sh``, run by ``.ci/run``, checks that it does).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import browser
from harness.haproxy import HAPROXY_MISSING
from harness.loopback import REDIS_MISSING, RedisServer, RedisUnavailable, free_port
from harness.loopback import redis_server as start_redis
from harness.postgres import POSTGRES_MISSING, pg_bindir

#: the fixtures that start a real server, by the marker of the tests that use them
SERVER_FIXTURES = {
    "redis": ("redis_server", "redis_url"),
    "postgres": ("postgres_server", "postgres_url"),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives the system Chromium with Playwright (tests/dashboard)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test that uses a real server's fixture, or the browser, as needing it
    (``-m redis`` selects it whether or not its author marked it)."""
    for item in items:
        used = getattr(item, "fixturenames", ())
        for marker, fixtures in SERVER_FIXTURES.items():
            if any(f in used for f in fixtures):
                item.add_marker(marker)
        module = getattr(item, "module", None)
        if getattr(module, "chromium", None) is browser.chromium:
            item.add_marker("browser")


def missing_binaries(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run on this machine (a binary its markers need is missing)."""
    if item.get_closest_marker("redis") and shutil.which("redis-server") is None:
        return REDIS_MISSING
    if item.get_closest_marker("postgres") and pg_bindir() is None:
        return POSTGRES_MISSING
    if item.get_closest_marker("haproxy") and shutil.which("haproxy") is None:
        return HAPROXY_MISSING
    if item.get_closest_marker("browser"):
        return browser.browser_missing()
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose binaries are missing before any of its fixtures is set up (a fixture
    that computes a reference run first would otherwise cost minutes before the skip)."""
    reason = missing_binaries(item)
    if reason is not None:
        pytest.skip(reason)


# ----------------------------------------------------------------------------- user files


@pytest.fixture(autouse=True)
def _own_config_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test (and what it starts) has its own empty user configuration folder: none
    reads or writes the user's (``fedrec tune`` saves presets there)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


# ----------------------------------------------------------------------------- redis


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server (no persistence) on a free port, stopped after the test."""
    if shutil.which("redis-server") is None:
        pytest.skip(REDIS_MISSING)
    try:
        with start_redis(tmp_path_factory.mktemp("redis")) as server:
            yield server
    except RedisUnavailable as err:
        pytest.fail(str(err))


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of a fresh redis-server."""
    return redis_server.url


# ----------------------------------------------------------------------------- postgres


@dataclass(frozen=True)
class PostgresServer:
    """A running PostgreSQL cluster (trust auth, user ``postgres``) on 127.0.0.1."""

    port: int
    datadir: Path

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg 3 driver) of one database of this cluster."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create a database and return its URL."""
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_postgres_user(cmd: list[str]) -> list[str]:
    """Run ``cmd`` as the ``postgres`` OS user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-c", shlex.join(cmd)]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster for the session, in a temp dir, stopped and removed after."""
    bindir = pg_bindir()
    if bindir is None:
        pytest.skip(POSTGRES_MISSING)
    if os.geteuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
    root = Path(tempfile.mkdtemp(prefix="fedrec-pg-"))
    datadir, sockdir = root / "data", root / "sock"
    sockdir.mkdir()
    if os.geteuid() == 0:
        for p in (root, sockdir):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    port = free_port()
    log = root / "server.log"
    try:
        subprocess.run(
            _as_postgres_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(datadir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        opts = f"-p {port} -k {sockdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_postgres_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(datadir),
                    "-l",
                    str(log),
                    "-o",
                    opts,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        detail = getattr(err, "stderr", b"") or b""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"could not start PostgreSQL: {detail.decode(errors='replace')[-300:]}")
    try:
        yield PostgresServer(port=port, datadir=datadir)
    finally:
        subprocess.run(
            _as_postgres_user(
                [str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "fast", "-w", "stop"]
            ),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """URL of a fresh, empty database on the session's PostgreSQL server."""
    name = "t_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:50].lower()
    name = f"{name}_{free_port()}"
    return postgres_server.create_database(name)
