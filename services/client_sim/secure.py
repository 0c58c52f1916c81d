"""A worker's clients in secure-aggregation rounds (:mod:`fedrecgel.secagg.protocol`, spoken
over ``/v1/rounds/{r}/secagg``; the aggregator's side is :mod:`services.aggregator.secagg`).

Each poll of an open round reads its phase and takes this worker's part of it once:

* ``keys``: a fresh :class:`~fedrecgel.secagg.protocol.Client` per owned cohort member (new
  keys every attempt, kept in memory only), its public keys sent; then the round's client
  step is taken (it needs nothing of the protocol), while the other workers' keys come in;
* ``shares``: each client secret-shares its mask key and self-mask seed to its neighbours,
  encrypted to each of them (the server only routes the ciphertexts);
* ``masked``: the result of the round's client step (:class:`fedrecgel.client_round.ClientRound`,
  as for a plain round), each update clipped when the run clips, laid out densely and
  fixed-point encoded, masked and sent, several clients' inputs in one body (a batch of at
  most :data:`MASKED_BODY_BYTES`, masked while the batch before it is on the wire); the
  clients' new private state is committed once the aggregator acknowledged their masked
  inputs;
* ``unmask``: each client that sent a masked input reveals its shares of surviving
  neighbours' self-mask seeds and of dropped neighbours' mask keys, never both of one client.

A sparse run (``secure_aggregation=sparse``) runs two protocol instances, each client with a
:class:`~fedrecgel.secagg.protocol.Client` in each (fresh mask keys apiece, one key to
encrypt shares for both): ``keys`` and
``shares`` send both instances' messages (B's tagged), ``masked`` sends A's input (the
client's item indicator outside the round's negative pool, from the client step, whose
result is kept in memory), ``unmask`` A's reveals; then ``masked_b`` sends, for each client
whose count was taken, its clipped update on the rows of the union the aggregator published
(and commits the new private state once acknowledged), and ``unmask_b`` B's reveals.

In a run of whole groups (``cohort_groups``) the worker checks the cohort it is shown before
its clients join: when the cohort holds some of this worker's clients of a group and not the
others, the aggregator did not draw whole groups, and this worker's clients sit the attempt
out (logged as an error), so no sum over part of their group holds their data. Only the
groups this worker sees whole can be checked: a client alone on its worker trusts the
aggregator's draw.

A worker that restarts in the middle of a round has lost its clients' keys: they sit the
attempt out (the protocol counts them as dropped, and their private state stays as it was).
A client refused at one step (409, 422, or refused on its own in a batch of masked inputs)
takes no further part in the attempt.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from fedrecgel.cohort import broken_groups
from fedrecgel.sam import StepResult
from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import (
    counts_spec,
    item_indicator,
    round_pool,
    round_spec,
    sparse_input,
    update_spec,
)
from fedrecgel.secagg.layout import flatten
from fedrecgel.secagg.protocol import Client, Keys, RoundFailed, RoundSpec, Shares
from fedrecgel.strategy import clip_update
from services.client_sim.aggregator_client import AggregatorCallError, AggregatorClient
from services.client_sim.store import WorkerStore
from services.contract import STEP_OF_PHASE, CurrentRound, RunConfig, SecAggRound

log = logging.getLogger(__name__)

#: the most bytes of one JSON body (the aggregator's JSON limit is 2 MiB by default)
JSON_BODY_BYTES = 1 << 20
#: the most bytes of one batch of masked inputs (an eighth of the aggregator's default upload
#: body limit, ``max_body_bytes`` of 64 MiB; a dense FilmTrust input is about 3 MB, a sparse
#: one about 0.6 MB): small enough that a worker masks its next batch while the last one is on
#: the wire; a single input larger than this still goes, alone
MASKED_BODY_BYTES = 8 << 20
#: the round's client step of some users from a model version: (cfg, version, round, users,
#: cohort size) -> their uploads and new private state
Compute = Callable[[RunConfig, int, int, list[int], int], StepResult]
Body = tuple[list[int], bytes]
Bodies = list[Body]


@dataclass
class Attempt:
    """This worker's clients in one round attempt, the steps they took, and the bodies of the
    step being sent (built once: a retry re-sends the same bytes, which the aggregator
    answers as duplicates). A sparse attempt's clients have a second protocol client each
    (``clients_b``, instance B), and its pool of negatives."""

    key: tuple[int, int, int]  # run, round, attempt
    version: int
    todo: list[int]
    spec: RoundSpec | None = None
    out: bool = False  # joined too late: every client sits the attempt out
    clients: dict[int, Client] = field(default_factory=dict)
    clients_b: dict[int, Client] = field(default_factory=dict)
    pool: np.ndarray | None = None
    done: set[str] = field(default_factory=set)
    outbox: dict[str, Iterable[Body]] = field(default_factory=dict)
    taken: dict[str, set[int]] = field(default_factory=dict)
    #: the client step, taken once the keys are sent (its result, or its failure, which the
    #: masked step raises); its result, once the masked step took it
    training: Future[StepResult] | None = None
    result: StepResult | None = None

    @property
    def sparse(self) -> bool:
        """Whether the attempt runs sparse secure aggregation's two instances."""
        return self.pool is not None

    def joined(self, step: str) -> list[dict[int, Client]]:
        """The protocol clients that take ``step`` (and leave the attempt when refused): both
        instances' for the keys and shares, and for A's input (B takes A's survivors only)."""
        if step.endswith("_b"):
            return [self.clients_b]
        if step == "reveal" or not self.sparse:
            return [self.clients]
        return [self.clients, self.clients_b]


class SecureParticipant:
    """The secure-aggregation side of a worker (one attempt at a time)."""

    def __init__(
        self,
        client: AggregatorClient,
        store: WorkerStore,
        compute: Compute,
        owned: Iterable[int] = (),
    ) -> None:
        self.client = client
        self.store = store
        self.compute = compute
        #: this worker's registered clients: what it checks a cohort of whole groups against
        self.owned = list(owned)
        self.attempt: Attempt | None = None

    def step(self, info: CurrentRound, cfg: RunConfig, version: int, todo: list[int]) -> bool:
        """Take this worker's part of the round's current phase; True when something was sent.
        ``todo``: the owned cohort members that have not committed this attempt."""
        assert info.run_id is not None and info.round_id is not None
        key = (info.run_id, info.round_id, info.attempt or 0)
        att = self.attempt
        if att is None or att.key != key:
            if not todo:
                return False
            att = self.attempt = Attempt(key, version, list(todo))
        if att.out or (att.spec is not None and not att.clients and not att.clients_b):
            return False  # every client of this worker left the attempt
        try:
            view = self.client.secagg_round(info.round_id)
        except AggregatorCallError as err:
            if err.retryable:
                raise
            return False  # the round moved on meanwhile
        step = STEP_OF_PHASE[view.phase]
        if view.attempt != key[2] or step in att.done:
            return False
        if att.spec is None:
            if view.phase != "keys":
                log.warning(
                    "round %d attempt %d is past its keys phase: %d clients sit it out",
                    key[1],
                    key[2],
                    len(att.todo),
                )
                att.out = True
                return False
            if self._split_groups(cfg, view):
                att.out = True
                return False
            self._join(att, cfg, view.cohort)
        if step not in att.outbox:
            att.outbox[step] = getattr(self, f"_{step}")(att, cfg, view)
        ok = self._send(att, step, att.outbox.pop(step))
        att.done.add(step)
        if step == "keys":
            att.training = self._train_now(cfg, att, len(view.cohort))
        if step == ("masked_b" if att.sparse else "masked") and ok:
            assert att.result is not None
            sent = [u for u in att.todo if u in ok]
            rows = np.asarray([att.todo.index(u) for u in sent])
            self.store.save_states(sent, att.result.state.select(rows), key[1], key[2])
            att.result = None
            log.info("round %d attempt %d: %d masked inputs sent", key[1], key[2], len(sent))
        return True

    def _split_groups(self, cfg: RunConfig, view: SecAggRound) -> list[int]:
        """The groups of this worker's clients that the attempt's cohort holds in part (none
        outside a run of whole groups), logged as an error."""
        if cfg.cohort_groups is None:
            return []
        split = broken_groups(self.owned, view.cohort, cfg.cohort_groups, cfg.seed)
        if split:
            log.error(
                "round %d attempt %d: the cohort holds part of group(s) %s of this worker's "
                "clients, not whole groups: its clients sit the attempt out",
                view.round_id,
                view.attempt,
                split,
            )
        return split

    def _train_now(self, cfg: RunConfig, att: Attempt, cohort_size: int) -> Future[StepResult]:
        """The attempt's client step, taken now, its failure kept for the masked step. Not in a
        thread beside the protocol's work: the step's many small tensor operations and the
        key agreements (which hold the GIL) then hand the GIL back and forth, and the worker's
        time went to that (``bench/secagg_http.py``: 0.3 s of system time a round, gone)."""
        done: Future[StepResult] = Future()
        try:
            done.set_result(self.compute(cfg, att.version, att.key[1], att.todo, cohort_size))
        except Exception as err:  # raised by the masked step, which computes anew next poll
            done.set_exception(err)
        return done

    def _trained(self, att: Attempt, cfg: RunConfig, cohort_size: int) -> StepResult:
        """The attempt's client step: the one taken after the keys, or (when that one failed, or
        none was taken) one taken now; a failure raises, and the next poll computes anew."""
        started, att.training = att.training, None
        if started is not None:
            return started.result()
        return self.compute(cfg, att.version, att.key[1], att.todo, cohort_size)

    @staticmethod
    def _join(att: Attempt, cfg: RunConfig, cohort: list[int]) -> None:
        """The attempt's protocol clients, fresh keys each (a sparse attempt's B clients deal
        their shares before the union is known: laid out on the pool's rows until then)."""
        model, r = cfg.model(), att.key[1]
        if cfg.secure_aggregation == "sparse":
            att.pool = round_pool(cfg, model.n_items, r)
            att.spec = counts_spec(model, cfg, r, cohort)
        else:
            att.spec = round_spec(model, cfg, r, cohort)
        att.clients = {u: Client(att.spec, u) for u in att.todo}
        if att.pool is not None:
            spec_b = update_spec(model, cfg, r, cohort, att.pool)
            att.clients_b = {u: Client(spec_b, u, att.clients[u]) for u in att.todo}

    # ------------------------------------------------------------------ the steps

    def _send(self, att: Attempt, step: str, bodies: Iterable[Body]) -> set[int]:
        """Send the bodies of one step; the clients whose messages were taken. ``bodies`` may
        be built as they are read (masked inputs): each is built while the one before it is
        on the wire. Clients of a refused body leave the attempt (a retryable failure raises:
        the unsent bodies, built in full, go back to the outbox, and the next poll sends them
        again)."""
        ok = att.taken.setdefault(step, set())  # over every try of this step
        todo = iter(bodies)
        with ThreadPoolExecutor(1, thread_name_prefix="secagg-send") as wire:
            flying: tuple[Body, Future[dict[int, str]]] | None = None
            while True:
                nxt = next(todo, None)  # built while ``flying`` is sent
                if flying is not None:
                    (ids, body), answer = flying
                    try:
                        got = answer.result()
                    except AggregatorCallError as err:
                        if err.retryable:
                            att.outbox[step] = [(ids, body), *([nxt] if nxt else []), *todo]
                            raise
                        log.warning(
                            "round %d: %s of clients %s refused: %s", att.key[1], step, ids[:5], err
                        )
                    else:
                        self._taken(att, step, got, ok)
                if nxt is None:
                    break
                flying = nxt, wire.submit(self.client.secagg_send, att.key[1], step, nxt[1])
        for clients in att.joined(step):
            for u in set(clients) - ok:
                clients.pop(u, None)
        return ok

    @staticmethod
    def _taken(att: Attempt, step: str, got: dict[int, str], ok: set[int]) -> None:
        """Record the aggregator's answer to one body in ``ok`` (its refusals logged)."""
        ok.update(u for u, st in got.items() if st != "refused")
        refused = sorted(u for u, st in got.items() if st == "refused")
        if refused:
            log.warning("round %d: %s of clients %s refused", att.key[1], step, refused[:5])

    @staticmethod
    def _json_bodies(ids: list[int], docs: list[bytes], budget: int = JSON_BODY_BYTES) -> Bodies:
        """JSON lists of ``docs`` (``ids``: their clients; a client's doc may be several
        documents joined by commas, kept in one body), each within ``budget`` bytes."""
        return [
            ([u for u, _ in part], b"[" + b",".join(d for _, d in part) + b"]")
            for part in _packed(zip(ids, docs, strict=True), budget, 0, 1)
        ]

    def _keys(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Bodies:
        docs = []
        for u, c in att.clients.items():
            doc = messages.encode_keys(c.advertise())
            if att.sparse:
                doc += b"," + messages.encode_keys(att.clients_b[u].advertise(), "b")
            docs.append(doc)
        return self._json_bodies(list(att.clients), docs)

    def _shares(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Bodies:
        keys: dict[str, dict[int, Keys]] = {"a": {}, "b": {}}
        for doc in view.messages:
            k = messages.decode_keys(json.dumps(doc).encode())
            keys[messages.instance_of(doc)][k.client_id] = k
        docs: list[bytes] = []
        for u, c in list(att.clients.items()):
            try:
                body = messages.encode_shares(c.share(keys["a"]))
                if att.sparse:
                    body += b"," + messages.encode_shares(att.clients_b[u].share(keys["b"]), "b")
                docs.append(body)
            except RoundFailed as err:
                log.warning("round %d: %s", att.key[1], err)
                att.clients.pop(u)
                att.clients_b.pop(u, None)
        return self._json_bodies(list(att.clients), docs)

    @staticmethod
    def _received(clients: dict[int, Client], view: SecAggRound) -> dict[int, dict[int, Shares]]:
        """The share messages of ``view`` by the client they address."""
        received: dict[int, dict[int, Shares]] = {u: {} for u in clients}
        for doc in view.messages:
            sh = messages.decode_shares(json.dumps(doc).encode())
            for u in sh.sealed:
                if u in received:
                    received[u][sh.client_id] = sh
        return received

    def _masked(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Iterable[Body]:
        received = self._received(att.clients, view)
        # the step of every owned cohort member, as a plain round takes it (the same batch)
        att.result = result = self._trained(att, cfg, len(view.cohort))
        model = cfg.model()
        uploads = dict(zip(att.todo, result.uploads, strict=True))

        def make(u: int) -> np.ndarray:
            upd = uploads[u]
            if att.pool is not None:  # A: the items it touches outside the pool
                return item_indicator(model, upd, att.pool)
            return flatten(model, clip_update(upd, cfg.clip) if cfg.clip is not None else upd)

        return self._masked_bodies(self._masked_inputs(att, "masked", att.clients, received, make))

    def _masked_inputs(
        self,
        att: Attempt,
        step: str,
        clients: dict[int, Client],
        received: dict[int, dict[int, Shares]],
        make: Callable[[int], np.ndarray],
    ) -> Iterator[tuple[int, bytes]]:
        """Each client's masked input of ``step`` (its input: ``make``), encoded, in the
        clients' order, built as it is read (masking threads were measured to gain nothing:
        the key agreements hold the GIL, and inputs masked ahead are fresh memory)."""
        for u, c in list(clients.items()):
            yield from self._mask(att, step, u, c, make(u), received[u])

    @staticmethod
    def _masked_bodies(
        inputs: Iterable[tuple[int, bytes]], budget: int = MASKED_BODY_BYTES
    ) -> Iterator[Body]:
        """Batches of masked inputs (``inputs``: each client's ``encode_masked`` bytes, read as
        the batches are), each within ``budget`` bytes (an input larger than that alone in its
        batch)."""
        head, each = len(messages.BATCH_MAGIC) + 4, 16  # the count; a client's id and length
        for part in _packed(inputs, budget, head, each):
            yield [u for u, _ in part], messages.encode_masked_batch(part)

    @staticmethod
    def _mask(
        att: Attempt, step: str, u: int, c: Client, x: np.ndarray, got: dict[int, Shares]
    ) -> Iterator[tuple[int, bytes]]:
        """Client ``u``'s masked input ``x`` of ``step``, encoded (none when the client leaves
        the attempt)."""
        r = att.key[1]
        try:
            masked = messages.encode_masked(c.masked(x, got))
        except RoundFailed as err:
            log.warning("round %d: %s", r, err)
            for clients in att.joined(step):
                clients.pop(u, None)
            return
        if c.clipped:
            log.warning(
                "round %d: client %d had %d values beyond the fixed-point range", r, u, c.clipped
            )
        yield u, masked

    def _reveal(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Bodies:
        return self._reveals(att, view, "a")

    def _reveals(self, att: Attempt, view: SecAggRound, inst: str) -> Bodies:
        """The reveals of instance ``inst``'s clients."""
        clients = att.clients_b if inst == "b" else att.clients
        docs = []
        for u, c in list(clients.items()):
            try:
                docs.append(messages.encode_reveal(c.reveal(view.survivors, view.dropped), inst))
            except RoundFailed as err:
                log.warning("round %d: %s", att.key[1], err)
                clients.pop(u)
        return self._json_bodies(list(clients), docs)

    def _masked_b(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Iterable[Body]:
        """B: each counted client's clipped update on the rows of the published union."""
        model, r = cfg.model(), att.key[1]
        union = np.asarray(view.union or [], dtype=np.int64)
        spec = update_spec(model, cfg, r, view.cohort, union)
        public = (view.length, view.word_bits, view.scale_bits)
        if public != (spec.length, spec.fixed.word_bits, spec.fixed.scale_bits):
            log.warning("round %d: the update instance's layout %s is not the run's", r, public)
            att.clients_b.clear()
            return []
        assert att.result is not None
        uploads = dict(zip(att.todo, att.result.uploads, strict=True))
        received = self._received(att.clients_b, view)

        for c in att.clients_b.values():
            c.respec(spec)
        inputs = self._masked_inputs(
            att,
            "masked_b",
            att.clients_b,
            received,
            lambda u: sparse_input(model, cfg, uploads[u], union),
        )
        return self._masked_bodies(inputs)

    def _reveal_b(self, att: Attempt, cfg: RunConfig, view: SecAggRound) -> Bodies:
        return self._reveals(att, view, "b")


def _packed(
    items: Iterable[tuple[int, bytes]], budget: int, head: int, each: int
) -> Iterator[list[tuple[int, bytes]]]:
    """``items`` (a client and its bytes) in order, in groups whose body stays within
    ``budget``: ``head`` bytes a body, ``each`` plus the item's own a client (an item larger
    than the budget alone in its group); each group as soon as it is full."""
    part: list[tuple[int, bytes]] = []
    size = head
    for item in items:
        if part and size + each + len(item[1]) > budget:
            yield part
            part, size = [], head
        part.append(item)
        size += each + len(item[1])
    if part:
        yield part
