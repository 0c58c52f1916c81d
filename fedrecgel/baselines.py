"""Reference points for every results table: popularity, random, and the centralized upper bound.

* ``popularity``: every user gets the items ranked by how many users trained on them. A federated
  model that does not beat it has learned item popularity and nothing personal.
* ``random``: candidates in a seeded random order (HR@10 about 0.10 with 99 negatives).
* ``central``: the same NCF (or MF) trained on the same split in one place, all users' samples
  shuffled into minibatches, Adam over every parameter: what the model can reach without
  federation, the ceiling that tells how much federation costs.

All three are evaluated on exactly the candidates of the split (test, and validation when the
split has it) with the metrics of :mod:`fedrecgel.metrics`, and report a :class:`RunResult`
like the simulator (for ``central`` one record per epoch), so the same tables and the same
validation-selected figure apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.client_round import ClientRound
from fedrecgel.config import DEFAULTS
from fedrecgel.data import Split
from fedrecgel.metrics import KS, means, metric_sums, per_user_metrics, rank_of_positive
from fedrecgel.model import ModelConfig, Scorer, forward_batched, init_private, init_shared
from fedrecgel.prior import item_counts, split_prior
from fedrecgel.sam import SAMConfig
from fedrecgel.simulate import RoundRecord, RunResult

BASELINES: tuple[str, ...] = ("popularity", "random", "central")
#: users whose candidates a fixed ranking scores at a time
USER_CHUNK = 1 << 16


def _candidate_metrics(
    scores: Callable[[np.ndarray, np.ndarray], Tensor],
    users: np.ndarray,
    items: np.ndarray,
    negatives: np.ndarray,
) -> dict[str, float]:
    """Mean HR/NDCG@K when ``scores(users, candidates)`` -> (U, 1 + N) ranks the candidates;
    more than ``USER_CHUNK`` users are scored a chunk at a time (the candidates and their
    scores of every user at once would take about 1.6 GB at a million users)."""
    if len(users) > USER_CHUNK:
        sums: dict[str, float] = {}
        for at in range(0, len(users), USER_CHUNK):
            part = slice(at, at + USER_CHUNK)
            got = _candidate_metrics(scores, users[part], items[part], negatives[part])
            for k, v in got.items():
                sums[k] = sums.get(k, 0.0) + v * len(users[part])
        return {k: v / len(users) for k, v in sums.items()}
    cand = np.concatenate([items[:, None], negatives], axis=1).astype(np.int64)
    logits = scores(users, cand)
    ranks = rank_of_positive(logits[:, 0], logits[:, 1:])
    return {k: float(v.mean()) for k, v in per_user_metrics(ranks, KS).items()}


def _fixed_ranking(
    split: Split, scores: Callable[[np.ndarray, np.ndarray], Tensor], name: str
) -> RunResult:
    t0 = time.perf_counter()
    users = np.arange(split.n_users)
    test = _candidate_metrics(scores, users, split.test_items, split.test_negatives)
    val: dict[str, float] = {}
    if split.val_items is not None and split.val_negatives is not None:
        val = _candidate_metrics(scores, users, split.val_items, split.val_negatives)
    rec = RoundRecord(round=0, n_clients=0, loss=float("nan"), seconds=0.0, test=test, val=val)
    rec.seconds = time.perf_counter() - t0
    return RunResult(
        config={"method": name}, dataset=split.name, rounds=[rec], wall_seconds=rec.seconds
    )


def item_popularity(split: Split) -> np.ndarray:
    """How many users have each item among their training items: (n_items,) int64."""
    return item_counts(split.train_items, split.n_items)


def popularity(split: Split) -> RunResult:
    """Rank every user's candidates by item popularity in training (ties count against the
    held-out item, as in every other ranking here)."""
    pop = torch.from_numpy(item_popularity(split).astype(np.float64))
    return _fixed_ranking(split, lambda _u, cand: pop[torch.from_numpy(cand)], "popularity")


def random_ranking(split: Split, seed: int = 0) -> RunResult:
    """Rank candidates in a seeded random order."""
    gen = torch.Generator().manual_seed(seed)

    def scores(_users: np.ndarray, cand: np.ndarray) -> Tensor:
        return torch.rand(cand.shape, generator=gen, dtype=torch.float64)

    return _fixed_ranking(split, scores, "random")


@dataclass(frozen=True)
class CentralConfig:
    """Centralized training of the same model: one Adam over all parameters."""

    model: ModelConfig
    epochs: int = 30
    lr: float = 0.001
    batch_size: int = 1024
    n_negatives: int = DEFAULTS.n_negatives
    seed: int = 0
    eval_every: int = DEFAULTS.eval_every  # (epochs)
    #: rank with the popularity prior too, as the federated run does (fedrecgel.prior)
    popularity_prior: bool = DEFAULTS.popularity_prior

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        for name in ("epochs", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.lr <= 10:  # the bound of the federated step sizes (NaN fails it too)
            raise ValueError(f"lr must be in (0, 10], got {self.lr}")
        if self.n_negatives < 0:
            raise ValueError(f"n_negatives must be >= 0, got {self.n_negatives}")


def central(
    split: Split,
    config: CentralConfig,
    on_epoch: Callable[[RoundRecord], None] | None = None,
    on_model: Callable[[RoundRecord, Scorer, dict[str, Tensor]], None] | None = None,
) -> RunResult:
    """Train the model centrally on ``split``; one record (loss, test, val metrics) per epoch.
    ``on_model`` sees each evaluated epoch's record with the model it evaluated (a scorer and
    every user's private rows, detached: not to be changed).

    Each epoch draws every user's samples the way a federated client draws them in a round
    (its training items shuffled, each with ``n_negatives`` negatives it never trained on),
    pools and shuffles them, and takes one Adam step per minibatch of BCE-with-logits.
    The initialisation is the federated one for the same seed.
    """
    config.validate()
    cfg = config.model
    if cfg.n_items != split.n_items:
        raise ValueError(f"model has {cfg.n_items} items, the split {split.n_items}")
    t_run = time.perf_counter()
    shared = {k: v.clone().requires_grad_(True) for k, v in init_shared(cfg, config.seed).items()}
    users = np.arange(split.n_users, dtype=np.int64)
    private = {k: v.requires_grad_(True) for k, v in init_private(cfg, config.seed, users).items()}
    opt = torch.optim.Adam([*shared.values(), *private.values()], lr=config.lr)
    shuffle = np.random.default_rng([config.seed, 0xCE17])
    # each epoch, every user's samples drawn as a federated client draws them in a round
    draw = ClientRound(cfg, SAMConfig(n_negatives=config.n_negatives), config.seed)
    prior = split_prior(split) if config.popularity_prior else None
    records: list[RoundRecord] = []
    for epoch in range(1, config.epochs + 1):
        t0 = time.perf_counter()
        per_user = draw.samples(epoch, users, split.user_train)
        s_users = torch.from_numpy(
            np.repeat(users, [len(items) for items, _ in per_user]).astype(np.int64)
        )
        s_items = torch.from_numpy(np.concatenate([items for items, _ in per_user]))
        s_labels = torch.from_numpy(np.concatenate([labels for _, labels in per_user]))
        order = torch.from_numpy(shuffle.permutation(len(s_items)))
        total = 0.0
        for start in range(0, len(order), config.batch_size):
            idx = order[start : start + config.batch_size]
            u, it, y = s_users[idx], s_items[idx], s_labels[idx]
            rows = {t: shared[t][it][:, None, :] for t in cfg.item_tables()}
            dense = {n: shared[n] for n in cfg.dense_names()}
            logits = forward_batched(
                cfg, {k: v[u] for k, v in private.items()}, rows, dense, False
            ).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(loss / len(idx))
            opt.step()
            total += float(loss.detach())
        rec = RoundRecord(
            round=epoch, n_clients=split.n_users, loss=total / len(order), seconds=0.0
        )
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            rec.take_evaluation(*_evaluate(cfg, shared, private, split, prior), split.n_users)
            if on_model is not None:
                detached = {k: v.detach() for k, v in shared.items()}
                on_model(rec, Scorer(cfg, detached), {k: v.detach() for k, v in private.items()})
        rec.seconds = time.perf_counter() - t0
        records.append(rec)
        if on_epoch is not None:
            on_epoch(rec)
    conf = asdict(config)
    conf["method"] = "central"
    return RunResult(
        config=conf,
        dataset=split.name,
        rounds=records,
        wall_seconds=time.perf_counter() - t_run,
    )


@torch.no_grad()
def _evaluate(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    private: dict[str, Tensor],
    split: Split,
    prior: Tensor | None,
) -> tuple[dict[str, float], dict[str, float]]:
    scorer = Scorer(cfg, shared)
    params = {k: v.detach() for k, v in private.items()}
    test = means(
        metric_sums(scorer, params, split.test_items, split.test_negatives, KS, prior=prior)
    )
    val: dict[str, float] = {}
    if split.val_items is not None and split.val_negatives is not None:
        val = means(
            metric_sums(scorer, params, split.val_items, split.val_negatives, KS, prior=prior)
        )
    return test, val
