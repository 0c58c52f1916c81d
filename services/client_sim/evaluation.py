"""Federated evaluation on a worker: metric sums of all its users for each model version.

A version v is scored with every owned user's private state as the store holds it, and must
be scored before the new states of round v + 1 are committed (so with the states after round
v, as the simulator evaluates); the worker (:mod:`services.client_sim.worker`) keeps that
order. The sums are then *kept*: written to the store's meta (``report:<v>``, with
``evaluated_version`` = v, in one transaction) before those states are committed, so a crash
loses no scored version and never scores one with later states. Kept reports are *delivered*
(``POST /v1/evaluations``, which adds the workers' sums up) in version order, each key removed
once the aggregator answered, maybe later and from another thread (the worker's upload
thread): a restarted worker delivers what it kept, and a repeat is answered as already
reported.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.metrics import KS, metric_sums
from fedrecgel.model import Scorer
from fedrecgel.prior import bounded_counts, log_prior
from fedrecgel.rank_fit import needs_fit, ranking_params
from services.client_sim.aggregator_client import (
    AggregatorCallError,
    AggregatorClient,
    DownloadedModel,
)
from services.client_sim.store import UserData, WorkerStore
from services.client_sim.timings import PhaseTimer
from services.contract import RunConfig

log = logging.getLogger(__name__)

#: meta key prefix of a kept report (``report:<version>``)
_REPORT = "report:"
#: meta key: the run whose item counts this worker reported
_COUNTED = "item_counts_run"
#: meta key: the version considered as its run's last (a stopped run's newest version is its
#: last, evaluated though passed over before the stop)
_FINAL = "final_version"


@dataclass(frozen=True)
class Scores:
    """The metric sums of one model version over a worker's users."""

    version: int
    sums: dict[str, float]
    count: int


@dataclass(frozen=True)
class Scored:
    """What one pass over the versions after the last scored one did: the versions through
    ``through`` were considered, and those the run evaluates (its ``eval_every``, and its
    last) were scored; ``final``: ``through`` was considered as the run's last."""

    through: int
    scores: list[Scores]
    final: bool = False


class RunPrior:
    """The popularity prior of the worker's run (:mod:`services.aggregator.popularity`): this
    worker's share of the item counts, reported once a run, and the run's summed counts, read
    back once they cover every client (fixed from then on, so kept)."""

    def __init__(self, client: AggregatorClient, store: WorkerStore, data: UserData) -> None:
        self.client = client
        self.store = store
        self.data = data
        self._fixed: tuple[int, Tensor] | None = None  # (run id, log prior)
        self._counted: int | None = None  # the run whose counts were reported (the store's)

    def counts(self, cfg: RunConfig) -> np.ndarray:
        """How many of the owned users hold each item in their training data; in a DP run
        that releases the counts, each user counts at most ``dp_prior_items`` of its items
        (the draw the simulator makes: :func:`fedrecgel.prior.user_draw`)."""
        if cfg.dp_prior_release:
            users = [int(u) for u in self.data.user_ids]
            return bounded_counts(self.data.train, users, cfg.dp_prior_items, cfg.seed, cfg.n_items)
        held = [np.unique(t) for t in self.data.train]
        return np.bincount(np.concatenate([np.empty(0, np.int64), *held]), minlength=cfg.n_items)

    def report(self, run_id: int, cfg: RunConfig) -> None:
        """Report the owned users' item counts for ``run_id`` once, when its settings rank
        with the prior (a refusal is logged and not retried; an outage is raised)."""
        if not cfg.prior_enabled or cfg.prior_from_rounds or self._counted == run_id:
            return  # (a sparse secure run's counts come from its rounds)
        if self.store.get_meta(_COUNTED) == str(run_id):  # before a restart
            self._counted = run_id
            return
        try:
            users = [int(u) for u in self.data.user_ids]
            self.client.report_item_counts(run_id, users, self.counts(cfg))
        except AggregatorCallError as err:
            if err.retryable:
                raise
            log.warning("item counts of run %d refused: %s", run_id, err)
        self.store.set_meta(**{_COUNTED: str(run_id)})
        self._counted = run_id

    def get(self) -> Tensor | None:
        """log(1 + n_i) of the current run's summed counts, once they are complete; None
        before, without validation items (nothing to choose the weight on) or when the run
        ranks without the prior."""
        run = self.store.get_meta("run_id")
        if run is None or self.data.val_items is None:
            return None
        if self._fixed is not None and self._fixed[0] == int(run):
            return self._fixed[1]
        try:
            info = self.client.prior(int(run))
        except AggregatorCallError as err:
            if err.retryable:
                raise
            return None  # an aggregator without the prior (404): the model alone
        n_items = int(self.store.get_meta("n_items") or -1)
        if not info.complete or info.counts is None or len(info.counts) != n_items:
            return None
        self._fixed = (int(run), log_prior(np.asarray(info.counts, dtype=np.int64)))
        return self._fixed[1]


class Evaluation:
    """The federated evaluation of one worker's users."""

    def __init__(
        self,
        client: AggregatorClient,
        store: WorkerStore,
        data: UserData,
        timer: PhaseTimer,
    ) -> None:
        self.client = client
        self.store = store
        self.data = data
        self.users: list[int] = np.asarray(data.user_ids).tolist()
        self.timer = timer
        self.prior = RunPrior(client, store, data)
        #: the run the worker trains (:meth:`adopt`): how its users fit their embeddings to a
        #: version before ranking it (none yet: the stored embeddings)
        self.run_cfg: RunConfig | None = None
        self._run_id: str | None = None
        self._train_of = dict(zip(self.users, data.train, strict=True))
        #: the embeddings the users the run fits ranked the newest scored version with (the
        #: device API sends these): (version, user -> row, name -> (fitted users, d))
        self.fitted: tuple[int, dict[int, int], dict[str, Tensor]] | None = None

    def adopt(self, run_id: str, cfg: RunConfig) -> None:
        """The run the worker trains now (a new one forgets the last run's fitted vectors)."""
        if run_id != self._run_id:
            self.fitted = None
        self._run_id, self.run_cfg = run_id, cfg

    def fitted_vector(self, user_id: int) -> dict[str, list[float]] | None:
        """The user's embeddings as fitted to the newest scored version (None: the run does
        not fit this user's, or no version was scored in this process yet; its stored ones are
        the ones to rank with then)."""
        fitted = self.fitted
        row = None if fitted is None else fitted[1].get(int(user_id))
        if fitted is None or row is None:
            return None
        return {name: t[row].tolist() for name, t in fitted[2].items()}

    def done(self) -> int:
        """The newest model version scored and kept (maybe not delivered yet)."""
        return int(self.store.get_meta("evaluated_version") or 0)

    def reported(self) -> int:
        """The newest model version delivered, with every one before it."""
        kept = self.kept()
        return min(kept) - 1 if kept else self.done()

    def kept(self) -> dict[int, Scores]:
        """The kept reports not delivered yet, by version."""
        out = {}
        for key, raw in self.store.meta_like(_REPORT).items():
            body = json.loads(raw)
            v = int(key.removeprefix(_REPORT))
            out[v] = Scores(v, {k: float(x) for k, x in body["sums"].items()}, int(body["count"]))
        return dict(sorted(out.items()))

    def up_to(
        self, version: int, model: DownloadedModel | None = None, final: bool = False
    ) -> bool:
        """Score, keep and deliver the versions after the last scored one up to ``version``
        that the run evaluates (``model``: one of them, already downloaded; ``final``:
        ``version`` is the run's last), and deliver what else was kept; whether there was
        anything to do."""
        scored = self.score_up_to(version, model, final)
        self.keep(scored)
        delivered = self.deliver()
        return bool(scored.scores) or delivered > 0

    def keep(self, scored: Scored) -> None:
        """Write scored versions to the store (one transaction), to be delivered."""
        meta = self.meta(scored)
        if meta:
            self.store.set_meta(**meta)

    def meta(self, scored: Scored) -> dict[str, str | int | None]:
        """The store meta values that keep ``scored`` (none when it considered no version):
        what :meth:`keep` writes, for a caller that writes them in a transaction of its own."""
        done = self.done()
        if scored.through <= done and not scored.scores and not scored.final:
            return {}
        reports: dict[str, str | int | None] = {
            f"{_REPORT}{sc.version}": json.dumps({"sums": sc.sums, "count": sc.count})
            for sc in scored.scores
        }
        if scored.final:
            reports[_FINAL] = f"{self._run_id}:{scored.through}"
        return {"evaluated_version": max(scored.through, done), **reports}

    def deliver(self) -> int:
        """Deliver the kept reports in version order; how many. A refusal that waiting cannot
        help is logged and the report dropped; any other failure is raised, the report kept."""
        kept = self.kept()
        for sc in kept.values():
            try:
                with self.timer.phase("report"):
                    self.client.report_evaluation(sc.version, sc.sums, sc.count, self.users)
            except AggregatorCallError as err:
                if err.retryable:
                    raise
                log.warning("evaluation of version %d refused: %s", sc.version, err)
            self.store.set_meta(**{f"{_REPORT}{sc.version}": None})
            log.info(
                "version %d: evaluated %d users, hr@10 %.4f",
                sc.version,
                sc.count,
                sc.sums.get("hr@10", 0.0) / max(sc.count, 1),
            )
        return len(kept)

    def score_up_to(
        self, version: int, model: DownloadedModel | None = None, final: bool = False
    ) -> Scored:
        """Score (not report yet) the versions after the last scored one up to ``version``
        that the run evaluates: every ``eval_every``-th, and ``version`` when ``final`` (the
        run's last), as the simulator evaluates its rounds. A stopped run's last is the
        newest version when it stopped, which may have been passed over as not evaluated
        before: it is scored then, once."""
        done = self.done()
        todo, final = self._due(version, final, done)
        scores = [
            self.score(v, model if model is not None and model.version == v else None) for v in todo
        ]
        return Scored(max(version, done), scores, final)

    def due(self, version: int, final: bool = False) -> bool:
        """Whether :meth:`score_up_to` has a version to score or a run's last to note."""
        todo, final = self._due(version, final, self.done())
        return bool(todo) or final

    def _due(self, version: int, final: bool, done: int) -> tuple[list[int], bool]:
        """The versions to score after ``done`` (the newest considered) up to ``version``, and
        whether ``version`` is considered the run's last for the first time."""
        cfg, last = self.run_cfg, version if final else -1
        todo = [v for v in range(done + 1, version + 1) if cfg is None or cfg.evaluates(v, last)]
        final = final and self.store.get_meta(_FINAL) != f"{self._run_id}:{version}"
        if final and version <= done and cfg is not None and not cfg.evaluates(version, -1):
            todo = [version] if cfg.evaluates(version, last) else []
        return todo, final

    def score(self, version: int, model: DownloadedModel | None = None) -> Scores:
        """Metric sums of model ``version`` (downloaded unless given) over all owned users,
        with their private states as the store holds them now."""
        if model is None:
            with self.timer.phase("download"):
                model = self.client.download_model(version)
        prior = self.prior.get()
        with self.timer.phase("evaluate"):
            scorer = Scorer(model.cfg, model.shared)
            params = self.ranking_params(model)
            d = self.data
            sums = metric_sums(scorer, params, d.test_items, d.test_negatives, KS, prior=prior)
            count = int(sums.pop("count"))
            if d.val_items is not None and d.val_negatives is not None:
                val = metric_sums(scorer, params, d.val_items, d.val_negatives, KS, prior=prior)
                val.pop("count")
                sums.update({f"val/{k}": v for k, v in val.items()})
        return Scores(version, sums, count)

    def ranking_params(self, model: DownloadedModel) -> dict[str, Tensor]:
        """The private parameters the users rank ``model`` with: their stored ones, fitted to
        it first when the run says so (:func:`fedrecgel.rank_fit.ranking_params`, the
        simulator's computation)."""
        states = self.store.load_states(self.users)
        cfg = self.run_cfg
        if cfg is None or not cfg.rank_fit_steps:
            return states.params
        users = np.asarray(self.users, dtype=np.int64)
        train = self._train_of.__getitem__
        hp, fit = cfg.sam(), cfg.rank_fit()
        params = ranking_params(
            model.cfg, model.shared, states, users, train, hp, fit, cfg.seed, model.version
        )
        if self.fitted is None or self.fitted[0] <= model.version:
            rows = needs_fit(states, fit)
            row_of = {self.users[r]: i for i, r in enumerate(rows.tolist())}
            idx = torch.from_numpy(rows)
            self.fitted = (model.version, row_of, {k: v[idx] for k, v in params.items()})
        return params
