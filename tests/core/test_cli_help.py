"""Every option's help text of `fedrec` is shown whole by `--help` (rich reads a bracketed
``[word: ...]`` as markup and drops it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fedrecgel.cli import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf command's path (``("data", "stats")``)."""
    subs = getattr(group, "commands", None)
    if subs is None:
        return [path]
    return [p for name, sub in subs.items() for p in _commands(sub, (*path, name))]


def _command(path: tuple[str, ...]) -> Any:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


@pytest.fixture(autouse=True)
def wide_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """Help as wide as it needs: typer reads TERMINAL_WIDTH once, when its rich_utils is first
    imported (by whichever test of the session used a typer app first), so set its width."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 4000)


def _flat(text: str) -> str:
    return re.sub(r"[\s│]+", " ", text)


@pytest.mark.parametrize("path", _commands(typer.main.get_command(app)), ids=" ".join)
def test_help_shows_every_options_help_whole(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(app, [*path, "--help"], env={"TERMINAL_WIDTH": "4000"})
    assert r.exit_code == 0, r.output
    shown = _flat(r.output)
    for param in _command(path).params:
        text = getattr(param, "help", None)
        if text:
            assert _flat(text) in shown, (param.name, text)


def test_tune_fraction_has_the_bounds_of_a_runs_fraction(tmp_path: Path) -> None:
    """`fedrec tune --help` offered 0 <= x <= 1 while a run refuses 0 (after reading the
    data, naming `fraction` rather than the option)."""
    r = CliRunner().invoke(app, ["tune", "--help"], env={"TERMINAL_WIDTH": "4000"})
    assert "Clients per round, as a fraction of users. [> 0, <= 1]" in _flat(r.output)
    storage = tmp_path / "s.db"
    r = CliRunner().invoke(app, ["tune", "--fraction", "0", "--storage", str(storage)])
    assert r.exit_code == 2, r.output
    assert "--fraction: Input should be greater than 0" in r.output, r.output
    assert not storage.exists()


@pytest.mark.parametrize("path", _commands(typer.main.get_command(app)), ids=" ".join)
def test_every_option_says_what_it_does(path: tuple[str, ...]) -> None:
    """--eval-every, and data export's --data-dir and --validation, had no help."""
    params = _command(path).params
    bare = [p.name for p in params if p.param_type_name == "option" and not p.help]
    assert not bare, bare
