"""The fast in-process federated simulator.

One round: draw the cohort, build each client's samples from its own keyed random stream,
run the batched hierarchical SAM step for the whole cohort (:func:`fedrecgel.sam.cohort_step`),
aggregate the uploads with the strategy, step the server optimizer, evaluate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.metrics import KS, means, metric_sums
from fedrecgel.model import ModelConfig, ModelKind, Scorer, init_shared
from fedrecgel.sam import PrivateState, SAMConfig, client_rng, client_samples, cohort_step
from fedrecgel.strategy import OptimizerName, Strategy, Weighting, make_strategy

log = logging.getLogger(__name__)

Method = Literal[
    "fedrecgel", "fedrecgel-no-shared-sam", "fedrecgel-no-private-sam", "fedncf", "fedmf"
]
METHODS: tuple[str, ...] = (
    "fedrecgel",
    "fedrecgel-no-shared-sam",
    "fedrecgel-no-private-sam",
    "fedncf",
    "fedmf",
)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (defaults: the reference code's real behaviour)."""

    method: Method = "fedrecgel"
    rounds: int = 100
    fraction: float = 0.1
    rho_sh: float = 0.02
    rho_ns: float = 0.02
    client_lr: float = 0.1
    server_lr: float = 0.001
    server_optimizer: OptimizerName = "adam"
    weighting: Weighting = "mean"
    clip: float | None = None
    n_negatives: int = 4
    chunk_size: int = 128
    factor: int = 32
    layers: int = 3
    seed: int = 0
    eval_every: int = 1
    # Compute each round's cohort in this many groups (user id % shards), as that many client
    # workers do. The maths is the same; only float rounding depends on which clients share a
    # batch, so set it to the worker count to reproduce a federated run bit for bit.
    shards: int = 1

    def model_kind(self) -> ModelKind:
        """NCF for every method except the MF baseline."""
        return "mf" if self.method == "fedmf" else "ncf"

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
        """Client hyperparameters."""
        rho_sh, rho_ns = self.effective_rho()
        return SAMConfig(
            rho_sh=rho_sh,
            rho_ns=rho_ns,
            client_lr=self.client_lr,
            n_negatives=self.n_negatives,
            chunk_size=self.chunk_size,
        )

    def model(self, n_items: int) -> ModelConfig:
        """Model shape for a catalogue of ``n_items``."""
        return ModelConfig(
            n_items=n_items, kind=self.model_kind(), factor=self.factor, layers=self.layers
        )

    def strategy(self) -> Strategy:
        """The server strategy."""
        return make_strategy(self.server_optimizer, self.server_lr, self.weighting, self.clip)

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""
        checks = [
            (self.method in METHODS, f"method must be one of {', '.join(METHODS)}"),
            (self.rounds >= 1, "rounds must be >= 1"),
            (0 < self.fraction <= 1, "fraction must be in (0, 1]"),
            (self.rho_sh >= 0 and self.rho_ns >= 0, "rho_sh and rho_ns must be >= 0"),
            (self.client_lr > 0 and self.server_lr > 0, "learning rates must be > 0"),
            (self.n_negatives >= 1, "n_negatives must be >= 1"),
            (self.chunk_size >= 1, "chunk_size must be >= 1"),
            (self.factor >= 1 and self.layers >= 1, "factor and layers must be >= 1"),
            (self.eval_every >= 0, "eval_every must be >= 0"),
            (self.shards >= 1, "shards must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


def cohort_size(n_candidates: int, fraction: float) -> int:
    """m = int(fraction * n), at least 1."""
    return max(1, int(fraction * n_candidates))


def select_cohort(
    candidates: np.ndarray, fraction: float, seed: int, round_id: int, attempt: int = 0
) -> np.ndarray:
    """The round's clients: uniform without replacement from ``candidates``, sorted.

    ``candidates`` is taken in sorted order, so the draw depends only on the set of ids, the
    seed, the round and the attempt (a retried round draws a new cohort).
    """
    ids = np.sort(np.asarray(candidates, dtype=np.int64))
    rng = np.random.default_rng([int(seed), int(round_id), int(attempt), 0xC0]).permutation(
        len(ids)
    )
    return np.sort(ids[rng[: cohort_size(len(ids), fraction)]])


class PrivateStore:
    """Private state of every user in one process, allocated lazily on first use.

    Nothing of size users x anything is allocated up front, so a 1e6-user population costs
    memory only for the users that have taken part.
    """

    def __init__(self, cfg: ModelConfig, seed: int, n_users: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.slot = np.full(n_users, -1, dtype=np.int64)
        self.size = 0
        self.data = PrivateState.fresh(cfg, seed, np.zeros(0, dtype=np.int64))

    def _ensure(self, user_ids: np.ndarray) -> np.ndarray:
        new = np.unique(user_ids[self.slot[user_ids] < 0])
        if len(new):
            fresh = PrivateState.fresh(self.cfg, self.seed, new)
            need = self.size + len(new)
            cap = self.data.step.shape[0]
            if need > cap:
                grow = max(need, 2 * cap, 1024)
                self.data = _grow(self.data, grow)
            rows = np.arange(self.size, need)
            self.data.assign(rows, fresh)
            self.slot[new] = rows
            self.size = need
        return self.slot[user_ids]

    def get(self, user_ids: np.ndarray) -> PrivateState:
        """The state of ``user_ids`` (copies), initialising users seen for the first time."""
        rows = self._ensure(np.asarray(user_ids, dtype=np.int64))
        return self.data.select(rows)

    def put(self, user_ids: np.ndarray, state: PrivateState) -> None:
        """Store the new state of ``user_ids``."""
        rows = self._ensure(np.asarray(user_ids, dtype=np.int64))
        self.data.assign(rows, state)

    def params(self, user_ids: np.ndarray) -> dict[str, Tensor]:
        """Current private parameters of ``user_ids``: name -> (U, d)."""
        rows = torch.from_numpy(self._ensure(np.asarray(user_ids, dtype=np.int64)))
        return {k: v[rows] for k, v in self.data.params.items()}


def _grow(state: PrivateState, capacity: int) -> PrivateState:
    n = state.step.shape[0]

    def pad(t: Tensor) -> Tensor:
        out = torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype)
        out[:n] = t
        return out

    return PrivateState(
        params={k: pad(v) for k, v in state.params.items()},
        exp_avg={k: pad(v) for k, v in state.exp_avg.items()},
        exp_avg_sq={k: pad(v) for k, v in state.exp_avg_sq.items()},
        step=pad(state.step),
    )


@dataclass
class RoundRecord:
    """What one round produced."""

    round: int
    n_clients: int
    loss: float
    seconds: float
    test: dict[str, float] = field(default_factory=dict)
    val: dict[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    """A finished run: config, per-round records, the headline figures."""

    config: dict[str, Any]
    dataset: str
    rounds: list[RoundRecord]
    wall_seconds: float

    def best_test(self, key: str = "hr@10") -> dict[str, Any] | None:
        """Test metrics at the round with the best test ``key`` (the paper's optimistic figure)."""
        evald = [r for r in self.rounds if r.test]
        if not evald:
            return None
        best = max(evald, key=lambda r: r.test[key])
        return {"round": best.round, **best.test}

    def selected(self, key: str = "hr@10") -> dict[str, Any] | None:
        """Test metrics at the round chosen on the validation ``key`` (the honest figure)."""
        evald = [r for r in self.rounds if r.val]
        if not evald:
            return None
        best = max(evald, key=lambda r: r.val[key])
        return {"round": best.round, **best.test}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "dataset": self.dataset,
            "config": self.config,
            "wall_seconds": self.wall_seconds,
            "best_test": self.best_test(),
            "selected_on_validation": self.selected(),
            "rounds": [asdict(r) for r in self.rounds],
        }


class Simulator:
    """Runs FedRecGEL (or a baseline) over a :class:`Split`, all clients in this process."""

    def __init__(self, split: Split, config: TrainConfig) -> None:
        config.validate()
        self.split = split
        self.config = config
        self.model_cfg = config.model(split.n_items)
        self.hp = config.sam()
        self.shared = init_shared(self.model_cfg, config.seed)
        self.strategy = config.strategy()
        self.store = PrivateStore(self.model_cfg, config.seed, split.n_users)
        self.users = np.arange(split.n_users, dtype=np.int64)
        self.round_id = 0

    def samples_for(
        self, user_ids: np.ndarray, round_id: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each client's samples for ``round_id`` (keyed by seed, round and user)."""
        return [
            client_samples(
                self.split.user_train(int(u)),
                self.split.n_items,
                self.hp.n_negatives,
                client_rng(self.config.seed, round_id, int(u)),
            )
            for u in user_ids
        ]

    def step(self) -> RoundRecord:
        """Run one round."""
        t0 = time.perf_counter()
        self.round_id += 1
        r = self.round_id
        cohort = select_cohort(self.users, self.config.fraction, self.config.seed, r)
        uploads, losses = [], []
        for part in self._shards(cohort):
            samples = self.samples_for(part, r)
            result = cohort_step(
                self.model_cfg, self.shared, part, self.store.get(part), samples, self.hp
            )
            self.store.put(part, result.state)
            uploads += result.uploads
            losses.append(result.losses)
        self.strategy.round(self.shared, uploads)
        rec = RoundRecord(
            round=r,
            n_clients=len(cohort),
            loss=float(np.concatenate(losses).mean()),
            seconds=0.0,
        )
        every = self.config.eval_every
        if every and (r % every == 0 or r == self.config.rounds):
            rec.test, rec.val = self.evaluate()
        rec.seconds = time.perf_counter() - t0
        log.info("round %d: %d clients, loss %.4f, test %s", r, len(cohort), rec.loss, rec.test)
        return rec

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
        test: dict[str, float] = {}
        val: dict[str, float] = {}
        for part in self._shards(self.users):
            params = self.store.params(part)
            _add(
                test,
                metric_sums(scorer, params, split.test_items[part], split.test_negatives[part], KS),
            )
            if split.val_items is not None and split.val_negatives is not None:
                _add(
                    val,
                    metric_sums(
                        scorer, params, split.val_items[part], split.val_negatives[part], KS
                    ),
                )
        return means(test), (means(val) if val else {})

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        """Run all rounds; ``on_round`` sees each record as it is made."""
        t0 = time.perf_counter()
        records = []
        torch.set_grad_enabled(False)
        try:
            for _ in range(self.config.rounds):
                rec = self.step()
                records.append(rec)
                if on_round is not None:
                    on_round(rec)
        finally:
            torch.set_grad_enabled(True)
        return RunResult(
            config=asdict(self.config),
            dataset=self.split.name,
            rounds=records,
            wall_seconds=time.perf_counter() - t0,
        )


def _add(total: dict[str, float], sums: dict[str, float]) -> None:
    for k, v in sums.items():
        total[k] = total.get(k, 0.0) + v


def with_seed(config: TrainConfig, seed: int) -> TrainConfig:
    """The same config with another seed."""
    return replace(config, seed=seed)
