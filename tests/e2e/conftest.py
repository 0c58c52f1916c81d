"""Fixtures of the end-to-end tests: the FilmTrust split and the simulator's reference run,
computed once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fedrecgel.data import Split, load_split
from services.launcher import worker_torch_threads
from tests.e2e.http_run import DATASET, PARTIAL, Reference, simulate_reference


@pytest.fixture(scope="session")
def split() -> Split:
    """The FilmTrust split shipped with the package (no validation hold-out)."""
    return load_split(DATASET)


@pytest.fixture(scope="session")
def reference(split: Split) -> Reference:
    """The simulator's 20-round run, computed once per session (snapshot after SHORT rounds)."""
    return simulate_reference(split)


@pytest.fixture(scope="session")
def partial_reference(split: Split) -> Reference:
    """The simulator's run with per-worker partial sums (:data:`~tests.e2e.http_run.PARTIAL`)."""
    return simulate_reference(split, PARTIAL)


@pytest.fixture
def threads() -> Iterator[None]:
    """Torch threads in this process as the two worker processes get them, for the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(2))
    try:
        yield
    finally:
        torch.set_num_threads(before)
