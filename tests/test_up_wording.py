"""The lines ``fedrec up`` prints read as English whatever the counts ("1 workers" was
printed for ``--workers 1``)."""

from __future__ import annotations

from services.up import registered


def test_one_worker_is_singular() -> None:
    assert registered(943, 1) == "943 clients registered by 1 worker"
    assert registered(943, 2) == "943 clients registered by 2 workers"
