"""A worker's registration of its users, and what it says when the aggregator refuses it:
the aggregator's answer and what to change in the deployment."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from services.client_sim.aggregator_client import AggregatorCallError, AggregatorClient
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import WorkerStore

log = logging.getLogger(__name__)

#: the store's meta key of the client token chosen for a registration not yet answered
PENDING_TOKEN = "registration_token"

#: what to change when the aggregator refuses a registration, by its error code
REGISTRATION_HINTS = {
    "unauthorized": "the enrolment token must be derived from this aggregator's enrolment "
    "secret (FEDREC_AGG_ENROLMENT_SECRET) for this worker's shard",
    "not_your_ids": "the aggregator's population (FEDREC_AGG_POPULATION or "
    "FEDREC_AGG_POPULATION_DATASET) must be the users of this worker's dataset",
    "no_population": "the aggregator must declare its population: set FEDREC_AGG_POPULATION "
    "or FEDREC_AGG_POPULATION_DATASET",
    "too_many_clients": "use more shards, or raise FEDREC_AGG_MAX_REGISTER_PER_REQUEST",
    "clients_held": "another client token holds these users: either another worker of this "
    "shard is running (stop one of them), or this worker lost the store that kept its token; "
    "then the operator releases the users (POST /v1/clients/release with the operator "
    "token, docs/API.md) and this worker registers them again",
}


def registration_refused(err: AggregatorCallError, settings: WorkerSettings, n_users: int) -> str:
    """The message of a refused registration: what the aggregator said and what to change."""
    hint = REGISTRATION_HINTS.get(err.code, "")
    if not hint and err.status_code == 401:
        hint = REGISTRATION_HINTS["unauthorized"]
    return (
        f"the aggregator refused to register the {n_users} users of shard {settings.shard} of "
        f"{settings.shards} ({settings.dataset}): {err.status_code} {err.code}: {err.detail}"
        + (f". Hint: {hint}" if hint else "")
    )


def register(
    client: AggregatorClient, store: WorkerStore, settings: WorkerSettings, users: Sequence[int]
) -> None:
    """Register the owned ``users`` once, with the shard's enrolment token; the client token
    is kept in the store (and given to ``client``). The worker chooses its client token and
    keeps it in the store before it asks, so a worker that died before the answer reached
    the store asks again with the same token and the aggregator accepts the same
    registration again (the users are held by that token; no other token may take them).
    WorkerError when the aggregator refuses (the message says why and what to change)."""
    token = store.get_meta("token")
    if token is not None:
        client.token = token
        return
    s = settings
    if s.enrolment_token is None:
        raise WorkerError(
            f"registering the users of shard {s.shard} of {s.shards} needs the shard's "
            "enrolment token: set FEDREC_WORKER_ENROLMENT_TOKEN or "
            "FEDREC_WORKER_ENROLMENT_TOKEN_FILE (`fedrec enrolment-token --shard "
            f"{s.shard} --shards {s.shards}` issues it from the aggregator's secret)"
        )
    chosen = store.get_meta(PENDING_TOKEN)
    if chosen is None:
        chosen = secrets.token_urlsafe(32)
        store.set_meta(**{PENDING_TOKEN: chosen})
    try:
        token = client.register(list(users), s.enrolment_token.get_secret_value(), chosen)
    except AggregatorCallError as err:
        if err.retryable:
            raise
        raise WorkerError(registration_refused(err, s, len(users))) from None
    store.set_meta(**{"token": token, PENDING_TOKEN: None})
    log.info("registered %d clients", len(users))
