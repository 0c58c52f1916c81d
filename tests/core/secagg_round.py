"""Round 1 of a secure-aggregation config, up to the protocol: what the tests of the
secure-aggregation messages and of the attack it closes both start from."""

from __future__ import annotations

from typing import NamedTuple

from fedrecgel.cohort import select_cohort
from fedrecgel.data.types import Split
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.protocol import Client, RoundSpec
from fedrecgel.secagg.server import Server
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.uploads import Update


class FirstRound(NamedTuple):
    """The simulator, its round-1 cohort's plain uploads, the round's spec, a fresh server and a
    protocol client for each member of the cohort."""

    sim: Simulator
    uploads: list[Update]
    spec: RoundSpec
    server: Server
    clients: dict[int, Client]


def first_round(split: Split, config: TrainConfig) -> FirstRound:
    """Round 1 of ``config`` on ``split``, before any protocol message."""
    sim = Simulator(split, config)
    cohort = select_cohort(sim.users, config.fraction, config.seed, 1)
    uploads = sim.clients.step(
        sim.shared, 1, cohort, split.user_train, sim.store.get(cohort)
    ).uploads
    spec = round_spec(sim.model_cfg, sim.params, 1, cohort.tolist())
    return FirstRound(sim, uploads, spec, Server(spec), {u: Client(spec, u) for u in spec.cohort})
