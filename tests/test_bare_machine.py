"""How the tests find redis-server, PostgreSQL and Chromium, and how a bare machine (none of
them) is told apart: scripts/test-without-services.sh hides them with these knobs, and the
tests that need them skip, saying which is missing (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import browser
from harness.loopback import REDIS_MISSING
from harness.postgres import BINDIR_VARIABLE, POSTGRES_MISSING, pg_bindir
from tests.conftest import missing_binaries, pytest_collection_modifyitems


def _binaries(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_fedrec_pg_bindir_names_the_folder_or_hides_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = _binaries(tmp_path / "pg", "initdb", "pg_ctl")
    monkeypatch.setenv(BINDIR_VARIABLE, str(both))
    assert pg_bindir() == both
    monkeypatch.setenv(BINDIR_VARIABLE, str(_binaries(tmp_path / "half", "pg_ctl")))
    assert pg_bindir() is None  # Debian's /usr/bin/pg_ctl is a wrapper, without initdb
    monkeypatch.setenv(BINDIR_VARIABLE, "")
    assert pg_bindir() is None  # hidden, even where /usr/lib/postgresql/*/bin exists


def test_without_the_variable_postgresql_is_looked_for_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BINDIR_VARIABLE, raising=False)
    monkeypatch.setattr("glob.glob", lambda pattern: [])  # no Debian cluster folders
    monkeypatch.setenv("PATH", str(_binaries(tmp_path / "bin", "initdb", "pg_ctl")))
    assert pg_bindir() == tmp_path / "bin"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert pg_bindir() is None


def test_a_browser_test_is_told_which_part_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDREC_CHROMIUM", str(tmp_path / "no-such-chromium"))
    assert browser.browser_missing() in (browser.CHROMIUM_MISSING, browser.PLAYWRIGHT_MISSING)
    fake = _binaries(tmp_path / "bin", "chromium")
    monkeypatch.delenv("FEDREC_CHROMIUM")
    monkeypatch.setenv("PATH", str(fake))
    assert browser.chromium_path() == str(fake / "chromium")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert browser.chromium_path() is None


class _Item:
    """What the hooks read of a collected test: its fixtures, module and markers."""

    def __init__(self, fixtures: tuple[str, ...] = (), module: object = None, *marks: str):
        self.fixturenames = fixtures
        self.module = module
        self.marks = list(marks)

    def add_marker(self, name: str) -> None:
        self.marks.append(name)

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.marks else None


def test_tests_using_a_server_fixture_or_the_browser_are_marked() -> None:
    uses_browser = SimpleNamespace(chromium=browser.chromium)
    items = [
        _Item(("tmp_path", "redis_url")),
        _Item(("postgres_url",)),
        _Item(("database_url",)),  # its PostgreSQL parameter carries the marker itself
        _Item(("tmp_path",), uses_browser),
        _Item(("tmp_path",), SimpleNamespace(chromium=lambda: None)),
    ]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.marks for i in items] == [["redis"], ["postgres"], [], ["browser"], []]


def test_a_marked_test_is_skipped_for_the_binary_it_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(_binaries(tmp_path / "bin", "initdb", "pg_ctl", "chromium")))
    monkeypatch.setenv(BINDIR_VARIABLE, str(tmp_path / "bin"))
    monkeypatch.delenv("FEDREC_CHROMIUM", raising=False)
    # a stand-in for pytest.Item, as above
    assert missing_binaries(_Item((), None, "redis")) == REDIS_MISSING  # type: ignore[arg-type]
    assert missing_binaries(_Item((), None, "postgres")) is None  # type: ignore[arg-type]
    assert missing_binaries(_Item((), None, "slow")) is None  # type: ignore[arg-type]
    _binaries(tmp_path / "bin", "redis-server")
    assert missing_binaries(_Item((), None, "redis")) is None  # type: ignore[arg-type]
    monkeypatch.setenv(BINDIR_VARIABLE, "")
    assert missing_binaries(_Item((), None, "redis", "postgres")) == POSTGRES_MISSING  # type: ignore[arg-type]
    (tmp_path / "bin" / "chromium").unlink()
    missing = missing_binaries(_Item((), None, "browser"))  # type: ignore[arg-type]
    assert missing is not None and missing in (
        browser.CHROMIUM_MISSING,
        browser.PLAYWRIGHT_MISSING,
    )
