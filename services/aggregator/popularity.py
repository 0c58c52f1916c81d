"""The popularity prior over HTTP: the clients' item counts, summed once per run.

The served ranking is the model's logit plus w * log(1 + n_i) (:mod:`fedrecgel.prior`), n_i
the number of clients holding item i in their training data. The server never sees a client's
items: at the start of a run whose settings enable the prior
(:attr:`fedrecgel.config.RunParams.prior_enabled`: not under secure aggregation, whose
guarantee does not cover the counts, nor under DP without a share of the budget for them) each
worker reports the counts summed over its clients (``POST /v1/runs/{run_id}/item-counts``), as
it reports evaluation sums. A report is checked before anything is stored: only ids the caller
holds, each counted at most once a run, items in the catalogue, each count between 1 and the
report's clients (a client holds an item once, so one worker cannot move an item's count by
more than its own clients). Once the reports cover every registered client the counts are
summed into the run's prior, fixed from then on (the reports are then deleted), and the
workers rank every version they evaluate with it (``GET /v1/runs/{run_id}/prior``). The weight
is chosen per evaluated version, where the version's metrics are published
(:mod:`services.aggregator.evaluation`).

A run with ``secure_aggregation=sparse`` takes no reports: each round's instance A unmasks how
many of its cohort hold each item outside the round's pool, and those counts, summed over the
rounds in the transaction that moves each round on (``round_item_counts``), fix the prior to
their estimate once they have counted the registered clients twice over
(:class:`fedrecgel.prior.RoundPrior`, as the simulator does): nothing the server did not
already learn.

In a DP run with ``dp_prior_share`` each client counts at most ``dp_prior_items`` of its items
(a report whose counts sum to more than that per client is refused), and the sum is fixed once
with Gaussian noise from the operating system's secret randomness on every item's count, of the
std the run's privacy plan gives (:attr:`fedrecgel.accountant.PrivacyPlan.prior_std`): central
DP, the trust the run's noisy mean of uploads already places in the aggregator. Only the noisy
counts are stored.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from datetime import datetime

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedrecgel.prior import RoundCounts, RoundPrior, release_counts
from fedrecgel.run_config import RunConfig
from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, Malformed, NotFound
from services.aggregator.models import (
    Clock,
    ItemCountClient,
    ItemCountReport,
    ModelVersion,
    RoundItemCounts,
    Run,
    RunPrior,
)
from services.aggregator.privacy import run_plan
from services.aggregator.repository import Repository, chunks
from services.contract import ItemCountsAck, ItemCountsRequest, PriorInfo

log = logging.getLogger(__name__)

#: the metric key of a version's chosen prior weight (services.aggregator.evaluation)
WEIGHT_KEY = "prior_weight"
#: how counts are stored: little-endian int64, one per item
_DTYPE = np.dtype("<i8")


class CountRepository:
    """Queries over ``item_count_reports``, ``item_count_clients`` and ``run_priors``."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def lock_run(self, run_id: int) -> Run | None:
        """A run's row, locked until the transaction ends: reports that together complete the
        coverage are serialized on it (neither may miss the other's uncommitted clients)."""
        return self.session.scalars(select(Run).where(Run.id == run_id).with_for_update()).first()

    def counted_clients(self, run_id: int, client_ids: Iterable[int]) -> set[int]:
        """Which of ``client_ids`` are counted in the run already."""
        t, out = ItemCountClient, set[int]()
        for part in chunks(client_ids):
            stmt = select(t.client_id).where(t.run_id == run_id, t.client_id.in_(part))
            out.update(int(c) for c in self.session.scalars(stmt))
        return out

    def add_report(self, run_id: int, req: ItemCountsRequest, now: datetime) -> bool:
        """Store a report and its clients, in a savepoint: False, and nothing stored, when a
        client was counted already (the unique constraint refused its row)."""
        try:
            with self.session.begin_nested():
                report = ItemCountReport(
                    run_id=run_id, items=req.items, counts=req.counts, created_at=now
                )
                self.session.add(report)
                self.session.flush()
                rows = [
                    {"run_id": run_id, "client_id": c, "report_id": report.id}
                    for c in req.client_ids
                ]
                self.session.execute(insert(ItemCountClient), rows)
        except IntegrityError:
            return False
        return True

    def count_counted(self, run_id: int) -> int:
        """How many clients the run's reports cover."""
        stmt = select(func.count()).select_from(ItemCountClient)
        return int(self.session.scalar(stmt.where(ItemCountClient.run_id == run_id)) or 0)

    def summed(self, run_id: int, n_items: int) -> np.ndarray:
        """The run's reports summed per item: (n_items,) int64."""
        total = np.zeros(n_items, dtype=np.int64)
        stmt = select(ItemCountReport.items, ItemCountReport.counts)
        for items, counts in self.session.execute(stmt.where(ItemCountReport.run_id == run_id)):
            np.add.at(total, np.asarray(items, dtype=np.int64), np.asarray(counts, np.int64))
        return total

    def fix(self, run_id: int, counts: np.ndarray, clients: int, now: datetime) -> None:
        """Store the run's prior and delete the reports it sums (nothing reads them again)."""
        blob = encode_counts(counts)
        self.session.add(RunPrior(run_id=run_id, counts=blob, clients=clients, created_at=now))
        self.session.execute(delete(ItemCountClient).where(ItemCountClient.run_id == run_id))
        self.session.execute(delete(ItemCountReport).where(ItemCountReport.run_id == run_id))

    def add_round(self, run_id: int, got: RoundCounts, now: datetime) -> bool:
        """Add a sparse secure round's unmasked counts to the run's (in the transaction that
        moves the round on); once they cover the registered clients (:class:`RoundPrior`) fix
        the run's prior to their estimate. True when this round fixed it."""
        if self.prior(run_id) is not None:  # fixed: nothing more to count (no query below)
            return False
        row = self.session.get(RoundItemCounts, run_id)
        acc = RoundPrior(len(got.counts))
        if row is not None:
            acc.counts, acc.exposure = decode_counts(row.counts), decode_counts(row.exposure)
            acc.counted = int(row.counted)
        acc.add(got)
        if row is None:
            row = RoundItemCounts(run_id=run_id)
            self.session.add(row)
        row.counts, row.exposure = encode_counts(acc.counts), encode_counts(acc.exposure)
        row.counted, row.updated_at = acc.counted, now
        clients = Repository(self.session).count_clients()
        if not acc.covers(clients):
            return False
        self.fix(run_id, acc.estimate(clients), clients, now)
        return True

    def prior(self, run_id: int) -> RunPrior | None:
        """The run's fixed prior, if its counts are complete."""
        return self.session.get(RunPrior, run_id)

    def newest_weight(self, run_id: int) -> tuple[float | None, int | None]:
        """The prior weight of the run's newest evaluated version and that version (None,
        None before any; the weight None when that version was ranked without the prior)."""
        stmt = select(ModelVersion.version, ModelVersion.metrics).where(
            ModelVersion.run_id == run_id, ModelVersion.metrics.is_not(None)
        )
        row = self.session.execute(stmt.order_by(ModelVersion.version.desc()).limit(1)).first()
        if row is None:
            return None, None
        weight = row.metrics.get(WEIGHT_KEY)
        return (None if weight is None else float(weight)), int(row.version)


def encode_counts(counts: np.ndarray) -> bytes:
    """How counts are stored: little-endian int64, one per item."""
    return counts.astype(_DTYPE).tobytes()


def decode_counts(blob: bytes) -> np.ndarray:
    """A stored prior's counts: (n_items,) int64."""
    return np.frombuffer(blob, dtype=_DTYPE).astype(np.int64)


def _int64(values: list[int], out_of_range: Malformed) -> np.ndarray:
    """``values`` as int64, or ``out_of_range`` raised for one beyond int64 (JSON integers are
    unbounded)."""
    try:
        return np.asarray(values, np.int64)
    except OverflowError:
        raise out_of_range from None


class Priors:
    """Stores the count reports of the current run and reads its prior."""

    def __init__(self, db: Database, clock: Clock, max_ids: int) -> None:
        self.db = db
        self.clock = clock
        self.max_ids = max_ids

    def check(self, caller: Caller, req: ItemCountsRequest, n_items: int) -> None:
        """Refuse a report that breaks a rule (403 / 422)."""
        n = len(req.client_ids)
        if n > self.max_ids:
            raise Malformed(
                f"{n} client ids in one report; at most {self.max_ids}", "too_many_clients"
            )
        foreign = sorted(set(req.client_ids) - caller.client_ids)
        if foreign:
            raise Forbidden(f"clients not held by this token: {foreign[:10]}", "not_owned")
        if len(req.items) != len(req.counts):
            raise Malformed(
                f"{len(req.items)} items but {len(req.counts)} counts", "count_mismatch"
            )
        bad_item = Malformed(f"an item id is outside 0..{n_items - 1}", "item_out_of_range")
        bad_count = Malformed(
            f"a count is outside 1..{n}: each of the {n} clients holds an item at most "
            "once (items no client holds are left out)",
            "count_out_of_range",
        )
        items, counts = _int64(req.items, bad_item), _int64(req.counts, bad_count)
        if items.size and (items.min() < 0 or items.max() >= n_items):
            raise bad_item
        if counts.size and (counts.min() < 1 or counts.max() > n):
            raise bad_count

    def report(self, caller: Caller, run_id: int, req: ItemCountsRequest) -> ItemCountsAck:
        """Store a count report of ``run_id``; complete coverage fixes the run's prior."""
        with self.db.transaction() as s:
            counts = CountRepository(s)
            run = counts.lock_run(run_id)
            if run is None:
                raise NotFound(f"run {run_id} does not exist", "run_not_found")
            repo = Repository(s)
            if repo.latest_run_id() != run_id:
                raise Conflict(f"run {run_id} is not the current run", "not_current_run")
            cfg = RunConfig.model_validate(run.config)
            if not cfg.prior_enabled or cfg.prior_from_rounds:
                raise Conflict(
                    f"run {run_id} takes no item counts: it ranks without the popularity prior "
                    "(popularity_prior off, dense secure aggregation, or DP without "
                    "dp_prior_share), or with one from its sparse secure rounds' counts",
                    "prior_off",
                )
            self.check(caller, req, cfg.n_items)
            n = len(req.client_ids)
            if cfg.dp_prior_release and sum(req.counts) > n * cfg.dp_prior_items:
                raise Malformed(
                    f"the counts sum to {sum(req.counts)}, but in this DP run each of the {n} "
                    f"clients counts at most dp_prior_items={cfg.dp_prior_items} items",
                    "count_out_of_range",
                )
            if counts.prior(run_id) is not None:  # fixed: nothing a report says changes it
                return ItemCountsAck(accepted=0, ignored=n, complete=True)
            if not counts.add_report(run_id, req, self.clock()):
                seen = counts.counted_clients(run_id, req.client_ids)
                if len(seen) < n:
                    raise Conflict(
                        f"{len(seen)} of the {n} clients are counted already in run {run_id}; "
                        "report them separately",
                        "counts_overlap",
                    )
                return ItemCountsAck(accepted=0, ignored=n, complete=False)
            counted, registered = counts.count_counted(run_id), repo.count_clients()
            complete = counted >= registered
            if complete:
                summed = counts.summed(run_id, cfg.n_items)
                plan = run_plan(repo, cfg) if cfg.dp_prior_release else None
                if plan is not None:  # the run's one release of its counts
                    rng = np.random.default_rng(secrets.randbits(128))
                    summed = release_counts(summed, plan.prior_std, rng)
                counts.fix(run_id, summed, counted, self.clock())
                log.info("run %d: popularity prior fixed over %d clients", run_id, counted)
        return ItemCountsAck(accepted=n, ignored=0, complete=complete)

    def info(self, run_id: int | None, with_counts: bool = True) -> PriorInfo:
        """The prior of run ``run_id`` (None: the current run), without its counts unless
        ``with_counts`` (its ETag needs none); 404 without such a run."""
        with self.db.read() as s:
            repo, counts = Repository(s), CountRepository(s)
            rid = repo.latest_run_id() if run_id is None else run_id
            run = None if rid is None else repo.get_run(rid)
            if run is None:
                raise NotFound(
                    "no run has been started" if run_id is None else f"run {run_id} does not exist",
                    "no_run" if run_id is None else "run_not_found",
                )
            enabled = RunConfig.model_validate(run.config).prior_enabled
            registered = repo.count_clients()
            fixed = counts.prior(run.id)
            if fixed is None:
                counted = counts.count_counted(run.id)
                return PriorInfo(
                    run_id=run.id,
                    enabled=enabled,
                    complete=False,
                    counted=counted,
                    registered=registered,
                )
            weight, version = counts.newest_weight(run.id)
            return PriorInfo(
                run_id=run.id,
                enabled=enabled,
                complete=True,
                counted=fixed.clients,
                registered=registered,
                counts=decode_counts(fixed.counts).tolist() if with_counts else None,
                weight=weight,
                weight_version=version,
            )


def prior_etag(info: PriorInfo) -> str:
    """The ETag of a prior answer: it changes when the counts complete or the weight moves."""
    return f'"prior-{info.run_id}-{int(info.complete)}-{info.weight_version}-{info.weight}"'
