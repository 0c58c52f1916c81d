"""What readers see of the current (newest) run: its round, a round's state, the history of
closed rounds and encoded model versions. Each read is one short transaction; nothing here
writes."""

from __future__ import annotations

from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Gone, NotFound
from services.aggregator.models import PARAMS
from services.aggregator.modelstore import ModelStore
from services.aggregator.privacy import run_plan
from services.aggregator.repository import Repository
from services.aggregator.schemas import (
    DEFAULT_HISTORY_LIMIT,
    CurrentRound,
    History,
    HistoryRound,
    RoundInfo,
    RunConfig,
)
from services.aggregator.shard_repository import missing_by_shard
from services.contract import ModelBlob


def _idle() -> CurrentRound:
    """The current round before any run was started."""
    return CurrentRound(
        run_id=None,
        round_id=None,
        attempt=None,
        state="idle",
        deadline=None,
        model_version=None,
        cohort=[],
        cohort_size=0,
        config=None,
    )


class RunReads:
    """Read-only views of the current run."""

    def __init__(self, db: Database, models: ModelStore) -> None:
        self.db = db
        self.models = models

    def current_round(self, caller: Caller) -> CurrentRound:
        """The current round as a client sees it (its own cohort members only)."""
        with self.db.read() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                return _idle()
            cfg = RunConfig.model_validate(run.config)
            live = repo.live_round(run.id)
            rnd = live if live is not None else repo.last_round(run.id)
            version = repo.latest_version_number(run.id)
        if live is not None:
            state = "paused" if live.state == "paused" or run.state == "paused" else "open"
        else:
            state = "finished" if run.ended else "closed"
        cohort: list[int] = []
        if rnd is not None and live is not None:
            cohort = (
                list(rnd.cohort)
                if caller.operator
                else [c for c in rnd.cohort if c in caller.client_ids]
            )
        return CurrentRound(
            run_id=run.id,
            round_id=None if rnd is None else rnd.round_id,
            attempt=None if rnd is None else rnd.attempt,
            state=state,  # type: ignore[arg-type]
            deadline=live.deadline if live is not None else None,
            model_version=live.base_version if live is not None else version,
            cohort=cohort,
            cohort_size=0 if rnd is None else len(rnd.cohort),
            config=cfg,
        )

    def round_info(self, round_id: int) -> RoundInfo:
        """The latest attempt of a round of the current run."""
        with self.db.read() as s:
            repo = Repository(s)
            run = repo.latest_run()
            rnd = None if run is None else repo.latest_attempt(run.id, round_id)
            if run is None or rnd is None:
                raise NotFound(f"round {round_id} does not exist", "round_not_found")
            received = repo.count_updates(rnd.id)
            secure = RunConfig.model_validate(run.config).secure_aggregation != "off"
            counted = rnd.state in ("open", "paused", "closed") and not secure
            missing = missing_by_shard(s, rnd.id, rnd.cohort) if counted else {}
            metrics = None
            if rnd.model_version is not None:
                row = repo.version_meta(run.id, rnd.model_version)
                metrics = None if row is None else row.metrics
        return RoundInfo(
            round_id=rnd.round_id,
            attempt=rnd.attempt,
            state=rnd.state,  # type: ignore[arg-type]
            cohort_size=len(rnd.cohort),
            updates_received=received,
            metrics=metrics,
            model_version=rnd.model_version,
            base_version=rnd.base_version,
            deadline=rnd.deadline,
            loss=rnd.loss,
            missing_by_shard=missing,
        )

    def history(self, after: int = 0, limit: int = DEFAULT_HISTORY_LIMIT) -> History:
        """The current run's closed rounds after round ``after``, at most ``limit`` of them;
        ``next_after`` says where the next page starts when there are more."""
        with self.db.read() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                return History(run_id=None, rounds=[])
            rounds = repo.closed_rounds(run.id, after, limit + 1)
            more = len(rounds) > limit
            rounds = rounds[:limit]
            versions = [r.model_version for r in rounds if r.model_version is not None]
            metrics = repo.version_metrics(run.id, min(versions), max(versions)) if versions else {}
            evaluated = repo.newest_evaluated_version(run.id)
            cfg = RunConfig.model_validate(run.config)
            plan = run_plan(repo, cfg)
        next_after = rounds[-1].round_id if more else None
        out = []
        for r in rounds:
            assert r.closed_at is not None and r.model_version is not None
            out.append(
                HistoryRound(
                    round_id=r.round_id,
                    model_version=r.model_version,
                    n_updates=r.n_updates or 0,
                    loss=r.loss,
                    metrics=metrics.get(r.model_version),
                    closed_at=r.closed_at,
                    seconds=(r.closed_at - r.opened_at).total_seconds(),
                    epsilon=None if plan is None else plan.epsilon(r.round_id),
                    n_bounded=len(r.bounded or []),
                )
            )
        if plan is None:
            return History(
                run_id=run.id,
                rounds=out,
                planned_rounds=cfg.rounds,
                next_after=next_after,
                evaluated_through=evaluated,
            )
        return History(
            run_id=run.id,
            rounds=out,
            planned_rounds=plan.rounds,
            delta=plan.delta,
            noise_multiplier=plan.noise,
            next_after=next_after,
            evaluated_through=evaluated,
        )

    def model_blob(self, version: int | None, run_id: int | None = None) -> ModelBlob:
        """An encoded version of the current run's model, or of run ``run_id``'s (the latest
        when ``version`` is None); 404 when the run or the version never existed, 410 when the
        retention policy pruned it."""
        with self.db.read() as s:
            repo = Repository(s)
            run = repo.latest_run() if run_id is None else repo.get_run(run_id)
            if run is None and run_id is not None:
                raise NotFound(f"run {run_id} does not exist", "run_not_found")
            if run is None:
                raise NotFound("no run has been started", "no_run")
            v = repo.latest_version_number(run.id) if version is None else version
            if v is None:
                raise NotFound("no model version exists", "version_not_found")
            hit = self.models.cached_blob(run.id, v)
            # the newest version is never pruned; an older one may have been, by a replica
            # (this one's cache forgets only what it pruned itself)
            if hit is not None and (version is None or not repo.version_pruned(run.id, v)):
                return hit
            found = repo.version_with_blobs(run.id, v, kinds=(PARAMS,))
            if found is None:
                raise NotFound(f"model version {v} does not exist", "version_not_found")
            row, blobs = found
            if PARAMS not in blobs:
                self.models.forget(run.id, [v])
                raise Gone(
                    f"model version {v} was pruned by the retention policy", "version_pruned"
                )
            blob = ModelBlob(run.id, v, blobs[PARAMS], row.digest)
        self.models.remember(blob)
        return blob
