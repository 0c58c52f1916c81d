"""`fedrec up` on a CSV of one's own: every service takes it by its file name in its folder,
and recommend_api answers in the file's own item ids."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.procs import fedrec_up_on
from tests.support.loopback import free_port

pytestmark = pytest.mark.slow


def test_up_trains_and_serves_a_csv_by_its_path(tmp_path: Path) -> None:
    rows = [f"user{u},item{(u * 7 + k * 13) % 150},{k}" for u in range(60) for k in range(8)]
    data = tmp_path / "data" / "shop.csv"
    data.parent.mkdir()
    data.write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    ports = (free_port(), free_port(), free_port())
    args = ["--dataset", str(data), "--rounds", "2", "--workers", "1", "--no-dashboard"]
    done = subprocess.run(
        fedrec_up_on(tmp_path / "up", ports, *args),
        env={**os.environ, "COLUMNS": "200"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "60 clients registered by 1 worker" in out and "final round 2: HR@10" in out
    served = [w for w in out.split() if w.startswith("item") and w[4:].isdigit()]
    assert len(served) == 30  # three users' top-10 in the file's own item ids
    assert "user 0 (user0)" in out  # and the users by their ids in the file
