"""The fast in-process federated simulator.

One round: draw the cohort (:func:`fedrecgel.cohort.select_cohort`), run the client round of
the whole cohort (:class:`fedrecgel.client_round.ClientRound`: keyed samples, batched
hierarchical SAM step, private-state update), aggregate the uploads with the strategy, step the server optimizer, evaluate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, get_args

import numpy as np
import torch
from pydantic import Field, model_validator

from fedrecgel.accountant import PrivacyPlan, plan_privacy
from fedrecgel.client_round import ClientRound
from fedrecgel.cohort import cohort_size, largest_group_cohort, select_cohort
from fedrecgel.config import RunParams, check
from fedrecgel.data import Split
from fedrecgel.item_spectrum import spectral_tables
from fedrecgel.metrics import KS, means, metric_sums
from fedrecgel.model import ModelConfig, Scorer, init_shared
from fedrecgel.prior import RoundPrior, choose, log_prior, run_prior
from fedrecgel.privacy import AdaptiveClip, ClientPrivacy, seeded_generator, with_privacy
from fedrecgel.private_store import PrivateStore
from fedrecgel.rank_fit import ranking_params
from fedrecgel.run_config import RunConfig, client_hyperparameters, model_shape, rank_fit_of
from fedrecgel.sam import SAMConfig, cohort_step
from fedrecgel.server_strategy import strategy_of
from fedrecgel.strategy import Strategy, touched_rows
from fedrecgel.upload_modes import Aggregate, RoundUploads, Upload, mode_of

log = logging.getLogger(__name__)

Method = Literal[
    "fedrecgel", "fedrecgel-no-shared-sam", "fedrecgel-no-private-sam", "fedncf", "fedmf"
]
METHODS: tuple[str, ...] = get_args(Method)


#: the cohorts a round may draw before a secure run gives up (each as the aggregator's attempts)
MAX_ATTEMPTS = 1000


class TrainConfig(RunParams):
    """Everything that defines a simulated run: the settings of a federated run
    (:class:`~fedrecgel.config.RunParams`, their defaults and bounds), and the simulator's own.
    The model ``kind`` follows the ``method`` (given only a kind, the method follows it)."""

    method: Method = "fedrecgel"
    # Compute each round's cohort in this many groups (user id % shards), as that many client
    # workers do. The maths is the same; only float rounding depends on which clients share a
    # batch, so set it to the worker count to reproduce a federated run bit for bit.
    shards: int = Field(default=1, ge=1)
    # Build every client's upload and let the strategy aggregate them, as the aggregator does
    # (with ``shards`` = the worker count this is a federated run bit for bit). Otherwise, when
    # the strategy's aggregate is a weighted mean, the clients' gradients are summed inside
    # the batched backward: faster and far less memory, the same maths up to float rounding.
    per_client_uploads: bool = False
    # With per-client uploads, compute them for groups of clients together, as client workers
    # started with ``grouped_uploads`` do (SAMConfig.grouped_uploads); otherwise one at a time.
    grouped_uploads: bool = False

    @model_validator(mode="before")
    @classmethod
    def _kind_of_method(cls, data: Any) -> Any:
        if isinstance(data, dict):
            method = data.get("method") or ("fedmf" if data.get("kind") == "mf" else "fedrecgel")
            data = {**data, "method": method, "kind": "mf" if method == "fedmf" else "ncf"}
        return data

    @classmethod
    def from_params(cls, params: RunParams, **own: Any) -> TrainConfig:
        """The simulator's config of a federated run's ``params`` (``own``: the simulator's
        settings; the method follows the model kind)."""
        return check({**params.model_dump(), **own}, cls)

    def replace(self, **changes: Any) -> TrainConfig:
        """This config with ``changes`` (ConfigError naming the first bad one)."""
        return check({**self.model_dump(), **changes}, TrainConfig)

    def run_params(self, **overrides: Any) -> RunParams:
        """The federated run that computes what this simulation does (``overrides``: e.g.
        dataset, deadline_s)."""
        rho_sh, rho_ns = self.effective_rho()
        values = self.model_dump(include=set(RunParams.model_fields))
        return check({**values, "rho_sh": rho_sh, "rho_ns": rho_ns, **overrides}, RunParams)

    def run_config(self, n_items: int, **overrides: Any) -> RunConfig:
        """:meth:`run_params` over a catalogue of ``n_items``: the body of ``POST /v1/runs``."""
        return check({"n_items": n_items, **self.run_params(**overrides).model_dump()}, RunConfig)

    def effective_rho(self) -> tuple[float, float]:
        """(rho_sh, rho_ns) after the method's ablations."""
        if self.method in ("fedncf", "fedmf"):
            return 0.0, 0.0
        if self.method == "fedrecgel-no-shared-sam":
            return 0.0, self.rho_ns
        if self.method == "fedrecgel-no-private-sam":
            return self.rho_sh, 0.0
        return self.rho_sh, self.rho_ns

    def sam(self) -> SAMConfig:
        """Client hyperparameters: those of :meth:`run_params`, with this upload grouping."""
        return replace(
            client_hyperparameters(self.run_params()), grouped_uploads=self.grouped_uploads
        )

    def model(self, n_items: int) -> ModelConfig:
        """Model shape for a catalogue of ``n_items``."""
        return model_shape(self, n_items)

    def strategy(self) -> Strategy:
        """The server strategy."""
        return strategy_of(self.run_params())


@dataclass
class RoundRecord:
    """What one round produced."""

    round: int
    n_clients: int
    loss: float
    seconds: float
    test: dict[str, float] = field(default_factory=dict)
    val: dict[str, float] = field(default_factory=dict)
    #: DP runs: the privacy spent once this round was released (at the run's delta)
    epsilon: float | None = None
    #: DP runs: the clip norm of the round's uploads (it moves with adaptive clipping)
    dp_clip: float | None = None
    #: the popularity prior's weight chosen on validation at this evaluation (``test`` and
    #: ``val`` are the ranking it serves); None when no prior was ranked
    prior_weight: float | None = None
    #: the model's own figures, without the prior (the same as ``test``/``val`` without one)
    model_test: dict[str, float] = field(default_factory=dict)
    model_val: dict[str, float] = field(default_factory=dict)

    def take_evaluation(self, test: dict[str, float], val: dict[str, float], n_val: int) -> None:
        """Record an evaluation's means (with the prior's rankings, if any): the figures served
        (:func:`fedrecgel.prior.choose` over ``n_val`` validation users) and the model's own."""
        served = choose(test, val, n_val)
        self.test, self.val, self.prior_weight = served.test, served.val, served.weight
        self.model_test, self.model_val = served.model_test, served.model_val


@dataclass
class RunResult:
    """A finished run: config, per-round records, the headline figures."""

    config: dict[str, Any]
    dataset: str
    rounds: list[RoundRecord]
    wall_seconds: float
    #: DP runs: the privacy plan (clip, noise multiplier, sampling, delta, rounds allowed)
    privacy: dict[str, Any] | None = None
    #: ``fedrec train --full-ranking``: the served round's model over the whole catalogue
    #: (:meth:`fedrecgel.full_ranking.ServedModel.ranked`, with popularity's figures)
    full_ranking: dict[str, Any] | None = None

    def best_test(self, key: str = "hr@10") -> dict[str, Any] | None:
        """Test metrics at the round with the best test ``key`` (the paper's optimistic figure)."""
        return self._test_at_best(lambda r: r.test, key)

    def selected(self, key: str = "hr@10") -> dict[str, Any] | None:
        """Test metrics at the round chosen on the validation ``key`` (the honest figure): the
        model's own validation figure chooses the round, the popularity prior's weight at that
        round is then the one its evaluation chose."""
        return self._test_at_best(lambda r: r.model_val or r.val, key)

    def _test_at_best(
        self, metrics: Callable[[RoundRecord], dict[str, float]], key: str
    ) -> dict[str, Any] | None:
        """Test metrics (and the round) where ``metrics(round)[key]`` is highest, over the
        rounds that have such metrics; None when none has."""
        evald = [r for r in self.rounds if metrics(r)]
        if not evald:
            return None
        best = max(evald, key=lambda r: metrics(r)[key])
        if best.prior_weight is None:
            return {"round": best.round, **best.test}
        # the served ranking's figures, the prior's weight, and the model's own at that round
        model = {f"model.{k}": v for k, v in best.model_test.items()}
        return {"round": best.round, **best.test, "prior_weight": best.prior_weight, **model}

    def epsilon_spent(self) -> float | None:
        """The privacy budget the run spent in all (the epsilon after its last round, at the
        plan's delta; each round's is in its record); None without DP."""
        return next((r.epsilon for r in reversed(self.rounds) if r.epsilon is not None), None)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "dataset": self.dataset,
            "config": self.config,
            "wall_seconds": self.wall_seconds,
            "best_test": self.best_test(),
            "selected_on_validation": self.selected(),
            "privacy": self.privacy and {**self.privacy, "epsilon_spent": self.epsilon_spent()},
            **({"full_ranking": self.full_ranking} if self.full_ranking is not None else {}),
            "rounds": [asdict(r) for r in self.rounds],
        }


class Simulator:
    """Runs FedRecGEL (or a baseline) over a :class:`Split`, all clients in this process."""

    def __init__(self, split: Split, config: TrainConfig) -> None:
        self.split = split
        self.config = config
        self.model_cfg = config.model(split.n_items)
        self.hp = config.sam()
        self.shared = init_shared(self.model_cfg, config.seed)
        self.strategy = config.strategy()
        self.store = PrivateStore(self.model_cfg, config.seed, split.n_users)
        self.users = np.arange(split.n_users, dtype=np.int64)
        self.params = config.run_config(split.n_items)  # its checks against the catalogue too
        self.mode = mode_of(self.params, self.model_cfg)
        largest = cohort_size(split.n_users, config.fraction)
        if config.cohort_groups is not None:
            largest = largest_group_cohort(
                self.users, config.fraction, config.seed, config.sampling, config.cohort_groups
            )
        self.mode.check_cohorts(split.n_users, largest)
        if config.sampling == "fixed" and config.fraction * split.n_users < 0.5:
            # int() would round it up to one client a round (Poisson cohorts may be empty)
            raise ValueError(
                f"--fraction {config.fraction:g} of {split.n_users} users is "
                f"{config.fraction * split.n_users:.2g} clients a round; at least "
                f"{1 / split.n_users:.2g} gives one"
            )
        self.privacy: PrivacyPlan | None = plan_privacy(config.run_params(), split.n_users)
        #: rounds this run takes (fewer than configured when a target epsilon stops it)
        self.total_rounds = config.rounds
        #: adaptive clipping's state (the clip norm of the next round)
        self.adaptive: AdaptiveClip | None = None
        if self.privacy is not None:
            shapes = {k: tuple(v.shape) for k, v in self.shared.items()}
            gen = seeded_generator(config.seed, 0x5E)
            private = with_privacy(self.strategy, self.privacy, shapes, gen)
            self.strategy, self.adaptive = private, private.adaptive
            self.total_rounds = self.privacy.rounds
            if self.privacy.item_noise > 0:  # fixed item tables from a co-occurrence release
                tables = spectral_tables(split, self.privacy.item_noise, config.seed, shapes)
                for name, table in tables.items():
                    self.shared[name].copy_(table)
        self.clients = ClientRound(
            self.model_cfg,
            self.hp,
            config.seed,
            None if self.privacy is None else ClientPrivacy.of(self.privacy),
        )
        if self.privacy is not None and not self.mode.plain:
            raise ValueError(
                "differential privacy together with secure aggregation is not wired into the "
                "simulator yet: choose one"
            )
        #: the popularity prior ranked beside the model at each evaluation (fedrecgel.prior;
        #: under DP the counts the plan releases)
        self.prior = run_prior(
            split, config.prior_enabled and not config.prior_from_rounds, self.privacy, config.seed
        )
        #: under sparse secure aggregation: the rounds' counts until they fix the prior
        self.round_prior = RoundPrior(split.n_items) if config.prior_from_rounds else None
        self.round_id = 0

    def samples_for(
        self, user_ids: np.ndarray, round_id: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each client's samples for ``round_id`` (keyed by seed, round and user)."""
        return self.clients.samples(round_id, user_ids, self.split.user_train)

    def step(self) -> RoundRecord:
        """Run one round."""
        t0 = time.perf_counter()
        self.round_id += 1
        r = self.round_id
        cfg = self.config
        cohort = self.cohort(r)
        clip = None if self.clients.dp is None else self.clients.dp.clip
        loss = self._train(r, cohort)
        rec = RoundRecord(
            round=r,
            n_clients=len(cohort),
            loss=loss,
            seconds=0.0,
            epsilon=None if self.privacy is None else self.privacy.epsilon(r),
            dp_clip=clip,
        )
        if cfg.evaluates(r, self.total_rounds):
            rec.take_evaluation(*self.evaluate(), n_val=self.split.n_users)
        rec.seconds = time.perf_counter() - t0
        log.info("round %d: %d clients, loss %.4f, test %s", r, len(cohort), rec.loss, rec.test)
        return rec

    def cohort(self, r: int) -> np.ndarray:
        """Round ``r``'s cohort. A secure round needs at least 2 clients: as the aggregator
        fails an attempt with fewer and draws a new cohort for the next attempt, so does this
        (a Poisson draw, or whole groups, can hold fewer)."""
        cfg = self.config
        for attempt in range(MAX_ATTEMPTS):
            cohort = select_cohort(
                self.users, cfg.fraction, cfg.seed, r, attempt, cfg.sampling, cfg.cohort_groups
            )
            if self.mode.plain or len(cohort) >= 2:
                return cohort
        raise ValueError(
            f"round {r}: {MAX_ATTEMPTS} draws gave no cohort of 2 clients for secure "
            "aggregation: raise --fraction"
        )

    def _train(self, r: int, cohort: np.ndarray) -> float:
        """The cohort's client step and the server's step; the clients' mean loss."""
        if self.mode.summable and not self.config.per_client_uploads and len(cohort):
            # (an empty Poisson cohort takes the uploads' path: no step, or a DP round's noise)
            samples = self.clients.samples(r, cohort, self.split.user_train)
            sizes = np.fromiter((len(s[0]) for s in samples), dtype=np.int64, count=len(samples))
            weights = self.strategy.linear_weights(sizes)
            if weights is not None:
                return self._train_summed(r, cohort, samples, weights)
        uploads: list[Upload] = []
        within = 0
        for part in self._shards(np.sort(cohort)):
            res = self.mode.produce(
                self.clients, self.shared, r, part, self.split.user_train, self.store.get(part)
            )
            self.store.put(part, res.state)
            uploads += self.mode.uploads(res)
            within += 0 if res.within is None else int(res.within.sum())
        shapes = {k: tuple(v.shape) for k, v in self.shared.items()}
        agg = self.mode.combine(self.strategy, shapes, RoundUploads(r, uploads))
        if self.adaptive is not None and self.clients.dp is not None:  # the next round's C
            dp = replace(self.clients.dp, clip=self.adaptive.update(within, len(uploads)))
            self.clients = replace(self.clients, dp=dp)
        if agg is None:
            return float("nan")
        agg.apply(self.strategy, self.shared)
        self._count(agg)
        return agg.loss

    def _count(self, agg: Aggregate) -> None:
        """Take a sparse secure round's counts into the prior until they fix it."""
        rp, n = self.round_prior, self.split.n_users
        if rp is None or agg.counts is None or self.prior is not None:
            return
        rp.add(agg.counts)
        if rp.covers(n) and self.split.has_validation:
            self.prior = log_prior(rp.estimate(n))

    def _train_summed(
        self,
        r: int,
        cohort: np.ndarray,
        samples: list[tuple[np.ndarray, np.ndarray]],
        weights: np.ndarray,
    ) -> float:
        """The clients' gradients summed inside the backward with the strategy's linear
        ``weights`` (no upload built), and the server's step on the sum."""
        total: dict[str, torch.Tensor] = {}
        losses = []
        for part in self._shards(cohort):
            pos = np.searchsorted(cohort, part)
            res = cohort_step(
                self.model_cfg,
                self.shared,
                part,
                self.store.get(part),
                [samples[i] for i in pos],
                self.hp,
                weights[pos],
            )
            self.store.put(part, res.state)
            assert res.aggregate is not None
            for k, v in res.aggregate.items():
                total[k] = total[k].add_(v) if k in total else v
            losses.append(res.losses)
        rows = None
        if self.config.server_update == "lazy":  # the items of the cohort's samples
            rows = touched_rows([s[0] for s in samples])
        self.strategy.apply(self.shared, total, rows)
        return float(np.concatenate(losses).mean())

    def _shards(self, users: np.ndarray) -> list[np.ndarray]:
        """``users`` split by user id % shards (the layout of the client workers)."""
        n = self.config.shards
        parts = [users[users % n == s] for s in range(n)] if n > 1 else [users]
        return [p for p in parts if len(p)]

    def evaluate(self) -> tuple[dict[str, float], dict[str, float]]:
        """Test (and validation, when the split has it) metrics over all users.

        Metric sums are taken per shard and added up, as the aggregator adds the workers'.
        """
        scorer = Scorer(self.model_cfg, self.shared)
        split = self.split
        sets: list[tuple[np.ndarray, np.ndarray, dict[str, float]]] = [
            (split.test_items, split.test_negatives, {})
        ]
        if split.val_items is not None and split.val_negatives is not None:
            sets.append((split.val_items, split.val_negatives, {}))
        for part in self._shards(self.users):
            params = self.ranking_params(part)
            for items, negs, total in sets:
                sums = metric_sums(scorer, params, items[part], negs[part], KS, prior=self.prior)
                _add(total, sums)
        test, *val = (means(total) for _, _, total in sets)
        return test, (val[0] if val else {})

    def ranking_params(self, users: np.ndarray) -> dict[str, torch.Tensor]:
        """The private rows ``users`` rank with now: their stored ones, or copies fitted to the
        model for users with few private steps (:func:`fedrecgel.rank_fit.ranking_params`)."""
        fit = rank_fit_of(self.config)
        if not fit.steps:
            return self.store.params(users)
        return ranking_params(
            self.model_cfg,
            self.shared,
            self.store.get(users),
            users,
            self.split.user_train,
            self.hp,
            fit,
            self.config.seed,
            self.round_id,
        )

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        """Run all rounds; ``on_round`` sees each record as it is made."""
        t0 = time.perf_counter()
        records = []
        torch.set_grad_enabled(False)
        try:
            for _ in range(self.total_rounds):
                rec = self.step()
                records.append(rec)
                if on_round is not None:
                    on_round(rec)
        finally:
            torch.set_grad_enabled(True)
        return RunResult(
            config=self.config.model_dump(),
            dataset=self.split.name,
            rounds=records,
            wall_seconds=time.perf_counter() - t0,
            privacy=None if self.privacy is None else asdict(self.privacy),
        )


def _add(total: dict[str, float], sums: dict[str, float]) -> None:
    for k, v in sums.items():
        total[k] = total.get(k, 0.0) + v


def with_seed(config: TrainConfig, seed: int) -> TrainConfig:
    """The same config with another seed."""
    return config.replace(seed=seed)
