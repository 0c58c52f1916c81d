"""No Python module of the repository is over 500 lines (the Alembic migrations aside): a
longer one is split along its seams."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
SKIPPED = {"migrations", "node_modules", "__pycache__"}  # and hidden folders (.venv, .git)


def project_modules(root: Path = ROOT) -> list[Path]:
    """Every Python file below ``root``, the migrations and hidden folders aside."""
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED and d[0] != ".")
        found += [Path(folder) / name for name in sorted(files) if name.endswith(".py")]
    return found


def long_modules(paths: list[Path], limit: int = MAX_LINES) -> dict[str, int]:
    """The files of ``paths`` over ``limit`` lines, with their line counts."""
    counts = {str(p): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {name: n for name, n in counts.items() if n > limit}


def test_the_check_sees_the_repository_and_flags_a_long_file(tmp_path: Path) -> None:
    names = {p.relative_to(ROOT).as_posix() for p in project_modules()}
    assert "fedrecgel/strategy.py" in names and "tests/test_module_size.py" in names
    assert not any("/migrations/" in name for name in names)
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * MAX_LINES)
    assert long_modules([long, short]) == {str(long): MAX_LINES + 1}


def test_no_module_is_over_500_lines() -> None:
    assert long_modules(project_modules()) == {}
