"""Client-level DP on the aggregator: the run's privacy plan, the noisy aggregation and the
norm check of every upload.

The plan's client population is the number of registered clients (read when it is needed:
clients enrolled after a run started change the accounting of later rounds). Noise comes from
the operating system's secret randomness, never from the run seed (which the config shows).
"""

from __future__ import annotations

import functools
import threading

from fedrecgel.accountant import PrivacyPlan, plan_privacy
from fedrecgel.config import SIMULATOR_ONLY, ConfigError, RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.privacy import ClientPrivacy, norm_bound, secret_generator, with_privacy
from fedrecgel.strategy import Strategy, update_norm
from fedrecgel.upload_modes import Upload
from services.aggregator.errors import Malformed
from services.aggregator.repository import Repository

# One plan is computed at a time: a calibration takes seconds of CPU (up to about 25 s for a
# small target over many rounds), and a plan not cached (a new run, or a registration that
# changed the number of clients) is asked for by every reader of the history at once, which
# each calibrated again in parallel; now they wait for the one computation and share it.
_PLAN_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _cached_plan(params: RunParams, n_users: int) -> PrivacyPlan | None:
    return plan_privacy(params, n_users)


def _plan(params: RunParams, n_users: int) -> PrivacyPlan | None:
    with _PLAN_LOCK:
        return _cached_plan(params, n_users)


def run_plan(repo: Repository, params: RunParams) -> PrivacyPlan | None:
    """The privacy plan of a run (None when it is not DP); 422 when it cannot be met."""
    if not params.dp_enabled:
        return None
    if given := [n for n in SIMULATOR_ONLY if getattr(params, n) is not None]:
        raise Malformed(
            f"{', '.join(given)} (adaptive clipping) runs in the simulator (fedrec train) only: "
            "the workers do not report whether their upload was within the clip norm; set "
            "dp_clip",
            "invalid_config",
        )
    if params.dp_item_share > 0:
        raise Malformed(
            "dp_item_share (item tables from a release of the item co-occurrence) runs in the "
            "simulator (fedrec train) only: the workers do not report their users' co-occurrence",
            "invalid_config",
        )
    if params.dp_mode == "distributed" and params.dp_noise is None:
        raise Malformed(
            "dp_mode distributed over HTTP needs dp_noise (the workers add their share of it; "
            "they cannot calibrate it from target_epsilon)",
            "invalid_config",
        )
    try:
        return _plan(
            RunParams(**params.model_dump(include=set(RunParams.model_fields))),
            max(1, repo.count_clients()),
        )
    except ConfigError as err:
        raise Malformed(f"{err.field}: {err.reason}", "invalid_config") from None


def private_strategy(strategy: Strategy, plan: PrivacyPlan | None, model: ModelConfig) -> Strategy:
    """``strategy`` with the plan's noisy mean around it (noise from secret randomness)."""
    if plan is None:
        return strategy
    return with_privacy(strategy, plan, model.shared_shapes(), secret_generator())


def check_upload(u: Upload, params: RunParams, cohort_size: int, model: ModelConfig) -> None:
    """422 unless the upload is within the clipping norm (plus, in distributed mode, the tail
    bound of its noise share for this round's cohort)."""
    if not params.dp_enabled:
        return
    share = ClientPrivacy.announced(params.dp_clip, params.dp_noise, params.dp_mode, cohort_size)
    bound = norm_bound(params.dp_clip, share.local_sigma, model.shared_shapes())
    norm = update_norm(u)
    if not norm <= bound:
        raise Malformed(
            f"client {u.client_id}: upload norm {norm:.6g} exceeds the run's clipping bound "
            f"{bound:.6g} (dp_clip {params.dp_clip:g})",
            "update_norm_too_large",
        )
