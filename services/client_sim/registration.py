"""What a worker says when the aggregator refuses to register its users: the aggregator's
answer and what to change in the deployment."""

from __future__ import annotations

from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.settings import WorkerSettings

#: what to change when the aggregator refuses a registration, by its error code
REGISTRATION_HINTS = {
    "unauthorized": "the enrolment token must be derived from this aggregator's enrolment "
    "secret (FEDREC_AGG_ENROLMENT_SECRET) for this worker's shard",
    "not_your_ids": "the aggregator's population (FEDREC_AGG_POPULATION or "
    "FEDREC_AGG_POPULATION_DATASET) must be the users of this worker's dataset",
    "no_population": "the aggregator must declare its population: set FEDREC_AGG_POPULATION "
    "or FEDREC_AGG_POPULATION_DATASET",
    "too_many_clients": "use more shards, or raise FEDREC_AGG_MAX_REGISTER_PER_REQUEST",
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
