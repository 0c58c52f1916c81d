"""The worker's loop (services/client_sim/loop.py): after a step whose upload left its round
open for other workers, it waits (for a version event, or the poll interval) before polling
again; after any other step that did something it polls again at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from services.client_sim.loop import follow_rounds


@dataclass
class ScriptedWorker:
    """What follow_rounds uses of a Worker; each step plays the next (did, left_open)."""

    script: list[tuple[bool, bool]]
    log: list[str] = field(default_factory=list)
    left_open: bool = False
    last_info: None = None

    def __post_init__(self) -> None:
        self.settings = SimpleNamespace(poll_min_s=0.2, poll_max_s=5.0)
        self.waiter = SimpleNamespace(wait=lambda s: self.log.append(f"wait {s:.2f}"))
        self.timer = SimpleNamespace(phase=self._phase)

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        yield

    def register(self) -> None:
        self.log.append("register")

    def step(self) -> bool:
        did, self.left_open = self.script.pop(0)
        self.log.append("step")
        return did

    def finished(self) -> bool:
        return not self.script

    def evaluated_version(self) -> int:
        return 0


def test_a_step_that_left_its_round_open_waits_before_the_next_poll() -> None:
    w = ScriptedWorker(
        [
            (True, False),  # closed its round (or evaluated): at once
            (True, True),  # its upload left the round open: wait first
            (False, False),  # nothing to do: wait longer
            (True, False),
            (False, False),
        ]
    )
    follow_rounds(w)  # type: ignore[arg-type]
    assert w.log == [
        "register",
        "step",
        "step",
        "wait 0.20",
        "step",
        "wait 0.30",
        "step",
        "step",
    ]
