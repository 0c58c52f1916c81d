"""A worker's masked inputs of secure aggregation go several to a body
(:meth:`SecureParticipant._masked_bodies`), within a byte budget; a client the aggregator
refuses on its own in a batch leaves the attempt, the batch's others stay."""

from __future__ import annotations

from typing import Any

from fedrecgel.secagg import messages
from services.client_sim.secure import MASKED_BODY_BYTES, Attempt, SecureParticipant


def test_masked_inputs_are_batched_within_the_budget() -> None:
    inputs = [(u, bytes([u]) * (100 + u)) for u in range(10)]
    bodies = SecureParticipant._masked_bodies(inputs, budget=400)
    assert [ids for ids, _ in bodies] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    for ids, body in bodies:
        assert len(body) <= 400
        assert messages.split_masked_batch(body, len(ids)) == [inputs[u] for u in ids]
    big = [(1, b"x" * 500), (2, b"y" * 10)]
    assert [ids for ids, _ in SecureParticipant._masked_bodies(big, budget=400)] == [[1], [2]]
    one = SecureParticipant._masked_bodies(inputs)
    assert len(one) == 1 and MASKED_BODY_BYTES >= 1 << 20


class Answers:
    """An aggregator client that answers every masked body with fixed statuses."""

    def __init__(self, statuses: dict[int, str]) -> None:
        self.statuses = statuses
        self.sent: list[bytes] = []

    def secagg_send(self, round_id: int, step: str, body: bytes) -> dict[int, str]:
        self.sent.append(body)
        return dict(self.statuses)


def test_a_client_refused_in_a_batch_leaves_the_attempt_alone() -> None:
    fake = Answers({1: "accepted", 2: "refused", 3: "duplicate"})
    p = SecureParticipant(fake, None, None)  # type: ignore[arg-type]
    att = Attempt((1, 1, 0), 0, [1, 2, 3])
    att.clients = {1: object(), 2: object(), 3: object()}  # type: ignore[dict-item]
    body: Any = messages.encode_masked_batch([(1, b"a"), (2, b"b"), (3, b"c")])
    ok = p._send(att, "masked", [([1, 2, 3], body)])
    assert ok == {1, 3} and set(att.clients) == {1, 3} and fake.sent == [body]
