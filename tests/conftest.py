"""Shared fixtures: real redis-server and PostgreSQL processes started in temp dirs.

Both skip cleanly (with the reason) when the binaries are not installed:
``apt-get install -y redis-server postgresql``.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.loopback import RedisServer, RedisUnavailable, free_port
from tests.support.loopback import redis_server as start_redis

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
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
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


def _pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


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
    bindir = _pg_bindir()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("PostgreSQL binaries not found (apt-get install -y postgresql)")
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
