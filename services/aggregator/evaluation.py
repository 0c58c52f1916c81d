"""Federated evaluation: clients report metric sums for a model version; once the reports
cover every registered client, the version's metrics (the means) are written, once.

A report is checked before anything is stored: only ids the caller holds, each at most once
per version, ``count`` equal to the number of ids, exactly the metrics every worker computes
(:data:`fedrecgel.metrics.METRIC_NAMES`, with or without all of their ``val/`` twins, and with
or without all of their ``prior@W/`` twins when the run ranks with the popularity prior: the
protocol fixes them, not the first report, so a report with other names cannot lock honest
ones out; a version publishes the metrics every report carried), and every metric a finite sum
of per-client values in [0, 1] (``0 <= sum <= count``). The means are exact sums
(``math.fsum``) of values so bounded, divided by the number of clients: nothing can overflow,
one client cannot move a mean by more than 1/population, and the honest reports always
complete. Only the versions the run evaluates take reports (:meth:`RunParams.evaluates`:
every ``eval_every``-th and the last, the last of a stopped run being its newest). With the
prior's sums the version publishes the ranking the prior's weight, chosen
on validation, serves (:func:`served_metrics`)."""

from __future__ import annotations

import logging
import math

from fedrecgel.metrics import METRIC_NAMES, PRIOR_METRIC_NAMES, VAL_METRIC_NAMES
from fedrecgel.prior import choose
from fedrecgel.run_config import RunConfig
from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, Malformed, NotFound
from services.aggregator.evaluation_repository import EvaluationRepository
from services.aggregator.models import Clock
from services.aggregator.popularity import WEIGHT_KEY, CountRepository
from services.aggregator.repository import Repository
from services.aggregator.schemas import EvaluationAck, EvaluationRequest

log = logging.getLogger(__name__)

_NAMES = frozenset(METRIC_NAMES)
_WITH_VAL = _NAMES | frozenset(VAL_METRIC_NAMES)
#: the sums of a worker that ranks with the run's popularity prior (services.aggregator.
#: popularity) too, test and val/
_PRIOR = frozenset(PRIOR_METRIC_NAMES)
_WITH_PRIOR = _WITH_VAL | _PRIOR | frozenset(f"val/{n}" for n in _PRIOR)
#: the largest model version (a 32-bit column)
MAX_VERSION = 2**31 - 1


class Evaluations:
    """Stores evaluation reports of the current run (one transaction per report)."""

    def __init__(self, db: Database, clock: Clock, max_ids: int) -> None:
        self.db = db
        self.clock = clock
        self.max_ids = max_ids

    def check(self, caller: Caller, req: EvaluationRequest) -> dict[str, float]:
        """The report's metric sums, once every rule holds (403 / 422 otherwise)."""
        if req.model_version > MAX_VERSION:
            raise Malformed(
                f"model_version {req.model_version} is above {MAX_VERSION}", "version_out_of_range"
            )
        if len(req.client_ids) > self.max_ids:
            raise Malformed(
                f"{len(req.client_ids)} client ids in one report; at most {self.max_ids}",
                "too_many_clients",
            )
        foreign = sorted(set(req.client_ids) - caller.client_ids)
        if foreign:
            raise Forbidden(f"clients not held by this token: {foreign[:10]}", "not_owned")
        if req.count != len(req.client_ids):
            raise Malformed(
                f"count {req.count} != {len(req.client_ids)} client ids", "count_mismatch"
            )
        sums = {k: v for k, v in req.sums.items() if k != "count"}
        names = set(sums)
        if names not in (_NAMES, _WITH_VAL, _WITH_PRIOR):
            unknown = [n[:64] for n in sorted(names - _WITH_PRIOR)[:5]]
            want = _WITH_PRIOR if names & _PRIOR else _WITH_VAL if names - _NAMES else _NAMES
            missing = sorted(want - names)[:10]
            raise Malformed(
                f"a report carries exactly the metrics {list(METRIC_NAMES)}, and the same "
                "prefixed 'val/' (all or none), and with the run's popularity prior the same "
                "again under 'prior@W/' for every weight W, with 'gain' and 'loss' (all or none)"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else ""),
                "invalid_metrics",
            )
        for name, value in sums.items():
            if not (math.isfinite(value) and 0.0 <= value <= req.count):
                raise Malformed(
                    f"metric {name!r}: sum {value!r} is outside 0..{req.count} (a sum over "
                    f"{req.count} clients of values in [0, 1])",
                    "metric_out_of_range",
                )
        return sums

    def report(self, caller: Caller, req: EvaluationRequest) -> EvaluationAck:
        """Store a federated-evaluation report; complete coverage sets the version's metrics."""
        sums = self.check(caller, req)
        v = req.model_version
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                raise NotFound("no run has been started", "no_run")
            # Reports of one version are serialized on its row: two concurrent reports that
            # together complete the coverage must not each miss the other's (uncommitted)
            # clients under READ COMMITTED and leave the metrics unset.
            row = repo.version_meta(run.id, v, for_update=True)
            if row is None:
                raise NotFound(f"model version {v} does not exist", "version_not_found")
            cfg = RunConfig.model_validate(run.config)
            last = cfg.rounds  # an ended run's last version is its newest (stopped: earlier)
            if run.ended:
                last = repo.latest_version_number(run.id) or last
            if not cfg.evaluates(v, last):
                raise Conflict(
                    f"run {run.id} does not evaluate version {v}: "
                    + (
                        f"it evaluates the multiples of eval_every {cfg.eval_every} and its "
                        f"last version ({last})"
                        if cfg.eval_every
                        else "its eval_every is 0 (no version is evaluated)"
                    ),
                    "version_not_evaluated",
                )
            if row.metrics is not None:  # final: nothing a report says changes them (and the
                # storage pass drops the per-client rows of such a version)
                n = len(req.client_ids)
                return EvaluationAck(model_version=v, accepted=0, ignored=n, complete=True)
            if sums.keys() & _PRIOR and CountRepository(s).prior(run.id) is None:
                raise Conflict(
                    f"run {run.id} has no fixed popularity prior: a report ranks without one",
                    "no_prior",
                )
            evals = EvaluationRepository(s)
            # the unique constraint finds a client reported before: only then is it looked up
            if not evals.add_evaluation(run.id, v, sums, req.count, req.client_ids, self.clock()):
                seen = evals.evaluated_clients(run.id, v, req.client_ids)
                if len(seen) < len(req.client_ids):
                    raise Conflict(
                        f"{len(seen)} of the {len(req.client_ids)} clients already reported "
                        f"for version {v}; report them separately",
                        "evaluation_overlap",
                    )
                return EvaluationAck(model_version=v, accepted=0, ignored=len(seen), complete=False)
            complete = False  # (a version with metrics was answered above)
            if evals.count_evaluated(run.id, v) >= repo.count_clients():
                reports = evals.evaluation_reports(run.id, v)
                total = sum(r.count for r in reports)
                # a name some report lacks (validation metrics from a worker without a
                # validation split) would be averaged as 0 for its clients: not published
                names = sorted(set.intersection(*(set(r.sums) for r in reports)))
                means = {
                    k: math.fsum(float(r.sums.get(k, 0.0)) for r in reports) / total for k in names
                }
                complete = repo.set_version_metrics(run.id, v, served_metrics(means, total))
                if complete:
                    log.info("version %d evaluated over %d clients: %s", v, total, means)
        return EvaluationAck(
            model_version=v, accepted=len(req.client_ids), ignored=0, complete=complete
        )


def served_metrics(means: dict[str, float], n_users: int) -> dict[str, float]:
    """A version's published metrics from its means over ``n_users``: the served ranking's
    under the plain names (and ``val/``), as the simulator's record holds them
    (:func:`fedrecgel.prior.choose`). Ranked with the popularity prior, also the weight chosen
    on validation (``prior_weight``) and the model's own figures under ``model/``; without it,
    the means as they are."""
    test = {k: v for k, v in means.items() if not k.startswith("val/")}
    val = {k.removeprefix("val/"): v for k, v in means.items() if k.startswith("val/")}
    served = choose(test, val, n_users)
    out = {**served.test, **{f"val/{k}": x for k, x in served.val.items()}}
    if served.weight is None:
        return out
    model = {**served.model_test, **{f"val/{k}": x for k, x in served.model_val.items()}}
    return {**out, WEIGHT_KEY: served.weight, **{f"model/{k}": x for k, x in model.items()}}
