"""The files of a worker's SQLite store: which file a URL names, and keeping it (and SQLite's
companion files) readable and writable by its owner only, since it holds private vectors and
the client token."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

from services.client_sim.store_codec import StoreError

PRIVATE_MODE = 0o600
#: SQLite's companion files of a database file (they hold its pages too)
SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None: another database, or in memory)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None  # a URI filename: SQLite itself opens it
    return Path(u.database)


def make_private(path: Path) -> None:
    """Create ``path`` readable and writable by its owner only, or narrow an existing file (and
    its SQLite companions) to that: the store holds private vectors and the client token."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)
    for suffix in SQLITE_COMPANIONS:
        companion = path.with_name(path.name + suffix)
        if companion.exists() and stat.S_IMODE(companion.stat().st_mode) != PRIVATE_MODE:
            companion.chmod(PRIVATE_MODE)


def make_private_store(path: Path) -> None:
    """:func:`make_private`, its failure a :class:`StoreError` that names the path."""
    try:
        make_private(path)
    except OSError as err:  # no such folder, a folder in the way, no permission
        raise StoreError(f"cannot open the store {path}: {err.strerror}") from None
