"""What a build and an ``up`` leave behind on the Docker host: the project's images declare no
VOLUME (every container of the image without a mount there would get an anonymous volume of
its own at each ``docker compose up``, which ``down -v`` leaves), and they are built in one
stage (the classic builder leaves an untagged image of each other stage, dangling).
``scripts/compose-smoke.sh`` checks both on a real engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "deploy" / "Dockerfile", ROOT / "deploy" / "balancer" / "Dockerfile"]


def _instructions(path: Path) -> list[str]:
    """The instruction keyword of each line that starts one (continuations and comments out)."""
    out, continued = [], False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not continued and stripped and not stripped.startswith("#"):
            out.append(stripped.split()[0].upper())
        continued = stripped.endswith("\\")
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_image_declares_no_volume_and_has_one_stage(dockerfile: Path) -> None:
    ins = _instructions(dockerfile)
    assert "VOLUME" not in ins
    assert ins.count("FROM") == 1
    assert not re.search(r"COPY\s+--from", dockerfile.read_text())


def test_the_instruction_reader_sees_a_volume_line(tmp_path: Path) -> None:
    """The check above can fail: a VOLUME line and a second stage are seen."""
    path = tmp_path / "Dockerfile"
    path.write_text(
        'FROM a AS build\nRUN x \\\n    VOLUME y\nFROM b\n# VOLUME z\nVOLUME ["/data"]\n'
    )
    assert _instructions(path) == ["FROM", "RUN", "FROM", "VOLUME"]
