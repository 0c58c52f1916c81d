"""Every option's help text of `fedrec` is shown whole by `--help` (rich, which drew it before,
read a bracketed ``[word: ...]`` as markup and dropped it), and the run settings' help shows the
defaults a run takes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.config import RunParams


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


#: help on one line per option (a wrapped line may break after a hyphen)
WIDE = {"terminal_width": 4000, "max_content_width": 4000}


def _help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], **WIDE)  # type: ignore[arg-type]
    assert r.exit_code == 0, r.output
    return r.output


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("path", _commands(typer.main.get_command(app)), ids=" ".join)
def test_help_shows_every_options_help_whole(path: tuple[str, ...]) -> None:
    shown = _flat(_help(*path))
    for param in _command(path).params:
        text = getattr(param, "help", None)
        if text:
            assert _flat(text) in shown, (param.name, text)


def test_tune_fraction_has_the_bounds_of_a_runs_fraction(tmp_path: Path) -> None:
    """`fedrec tune --help` offered 0 <= x <= 1 while a run refuses 0 (after reading the
    data, naming `fraction` rather than the option)."""
    assert "Clients per round, as a fraction of users. [> 0, <= 1]" in _flat(_help("tune"))
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


@pytest.mark.parametrize("command", ["train", "up"])
def test_help_shows_the_default_presets_settings_as_defaults(command: str) -> None:
    """`fedrec train --help` said `--rounds [default: 100]` and `--server-lr [default: 0.001]`
    (the paper's, RunParams' own) while a run without --preset trains the default preset's 300
    rounds at its step size; a DP run takes the private preset's."""
    import services.cli  # noqa: F401  (adds `up` and the services' commands to the app)
    from fedrecgel.presets import PRESETS_FILE, resolve

    default, private = resolve("default", "", PRESETS_FILE), resolve("private", "", PRESETS_FILE)
    lines = {
        line.split()[0]: line for line in _help(command).splitlines() if line.startswith("  --")
    }
    for name in ("rounds", "server_lr"):
        line = lines["--" + name.replace("_", "-")]
        assert f"[default: ({default[name]}: default preset; {private[name]}: private" in line, line
    assert f"[default: ({default['client_lr']}: default preset)]" in lines["--client-lr"]
    line = lines["--server-momentum"]
    assert (
        f"[default: ({RunParams().server_momentum}; {private['server_momentum']}: private" in line
    )
