"""Federated evaluation: clients report metric sums for a model version; once the reports
cover every registered client, the version's metrics (the means) are written, once."""

from __future__ import annotations

import logging

from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, Malformed, NotFound
from services.aggregator.models import Clock
from services.aggregator.repository import Repository
from services.aggregator.schemas import EvaluationAck, EvaluationRequest

log = logging.getLogger(__name__)


class Evaluations:
    """Stores evaluation reports of the current run (one transaction per report)."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def report(self, caller: Caller, req: EvaluationRequest) -> EvaluationAck:
        """Store a federated-evaluation report; complete coverage sets the version's metrics."""
        foreign = sorted(set(req.client_ids) - caller.client_ids)
        if foreign and not caller.operator:
            raise Forbidden(f"clients not held by this token: {foreign[:10]}", "not_owned")
        if req.count != len(req.client_ids):
            raise Malformed(
                f"count {req.count} != {len(req.client_ids)} client ids", "count_mismatch"
            )
        sums = {k: v for k, v in req.sums.items() if k != "count"}
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
            seen = repo.evaluated_clients(run.id, v, req.client_ids)
            if seen and len(seen) < len(req.client_ids):
                raise Conflict(
                    f"{len(seen)} of the {len(req.client_ids)} clients already reported for "
                    f"version {v}; report them separately",
                    "evaluation_overlap",
                )
            if seen:
                return EvaluationAck(
                    model_version=v, accepted=0, ignored=len(seen), complete=row.metrics is not None
                )
            repo.add_evaluation(run.id, v, sums, req.count, req.client_ids, self.clock())
            complete = row.metrics is not None
            if not complete and repo.count_evaluated(run.id, v) >= repo.count_clients():
                reports = repo.evaluation_reports(run.id, v)
                total = sum(r.count for r in reports)
                names = sorted({k for r in reports for k in r.sums})
                means = {k: sum(r.sums.get(k, 0.0) for r in reports) / total for k in names}
                complete = repo.set_version_metrics(run.id, v, means)
                if complete:
                    log.info("version %d evaluated over %d clients: %s", v, total, means)
        return EvaluationAck(
            model_version=v, accepted=len(req.client_ids), ignored=0, complete=complete
        )
