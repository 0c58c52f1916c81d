"""A throw-away PostgreSQL cluster for benchmarks (trust auth on loopback, in a temp dir)."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.loopback import free_port


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries are missing, or the cluster did not start."""


@dataclass(frozen=True)
class Postgres:
    """A running cluster: its port, and the SQLAlchemy URL of its ``postgres`` database."""

    port: int

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg 3 driver) of one database of this cluster."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"


#: why a test that needs PostgreSQL is skipped on a machine without it
POSTGRES_MISSING = "PostgreSQL binaries not found (apt-get install -y postgresql)"
#: names the folder of PostgreSQL's initdb and pg_ctl; set and empty: there is none (how
#: scripts/test-without-services.sh hides an installed PostgreSQL from the tests)
BINDIR_VARIABLE = "FEDREC_PG_BINDIR"


def pg_bindir() -> Path | None:
    """The folder of PostgreSQL's ``initdb`` and ``pg_ctl``: ``$FEDREC_PG_BINDIR`` when set,
    else Debian's newest ``/usr/lib/postgresql/*/bin``, else the folder of ``pg_ctl`` on PATH;
    None when there is none."""
    named = os.environ.get(BINDIR_VARIABLE)
    if named is not None:
        candidates = [named] if named else []
    else:
        debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        on_path = shutil.which("pg_ctl")
        candidates = [str(Path(p).parent) for p in debian[-1:] or ([on_path] if on_path else [])]
    for folder in map(Path, candidates):
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    return None


def _as_postgres(cmd: list[str]) -> list[str]:
    """Run ``cmd`` as the ``postgres`` user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    return (
        [runuser, "-u", "postgres", "--", *cmd]
        if runuser
        else ["su", "postgres", "-c", shlex.join(cmd)]
    )


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Postgres]:
    """initdb + pg_ctl start on a free port (default settings: autovacuum on), removed after."""
    bindir = pg_bindir()
    if bindir is None:
        raise PostgresUnavailable(POSTGRES_MISSING)
    root = Path(tempfile.mkdtemp(prefix="fedrec-pg-"))
    datadir, sockdir = root / "data", root / "sock"
    sockdir.mkdir()
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        for p in (root, sockdir):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    port = free_port()
    ctl = str(bindir / "pg_ctl")
    try:
        subprocess.run(
            _as_postgres(
                [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        opts = f"-p {port} -k {sockdir} -c listen_addresses=127.0.0.1"
        subprocess.run(
            _as_postgres(
                [ctl, "-D", str(datadir), "-l", str(root / "log"), "-o", opts, "-w", "start"]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"could not start PostgreSQL: {err}") from None
    try:
        yield Postgres(port)
    finally:
        subprocess.run(
            _as_postgres([ctl, "-D", str(datadir), "-m", "fast", "-w", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)
