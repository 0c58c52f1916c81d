"""Full-catalogue ranking: each held-out item against every item its user has not interacted
with, instead of against the split's 99 sampled negatives.

Sampled metrics can order models differently from the full ranking they estimate (Krichene
and Rendle, KDD 2020), and popularity gains most from the sampling: a sampled negative is
usually an item few users hold. These functions rank the test item (and the validation item)
among all items but the user's other known ones (its training items and its other held-out
item; an item the user also trained on, as the ``paper`` protocol keeps repeated pairs, stays
a candidate as the held-out item it is), ties counted against the held-out item as everywhere
here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.metrics import KS, per_user_metrics
from fedrecgel.model import Scorer
from fedrecgel.prior import PRIOR_WEIGHTS, split_prior

if TYPE_CHECKING:
    from fedrecgel.simulate import RoundRecord, Simulator

#: users scored at a time: (users x items) logits and masks of that shape are held, and the
#: score network's (users x 8192 x width) activations
USERS_PER_CHUNK = 16

#: the figures kept of each full ranking
KEPT = ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "val/hr@10")


def kept_figures(metrics: Mapping[str, float]) -> dict[str, float]:
    """The figures of :data:`KEPT` of one full ranking's metrics."""
    return {k: metrics[k] for k in KEPT}


#: scores of some users for every item: user ids (U,) -> (U, n_items)
Scores = Callable[[np.ndarray], Tensor]


@torch.no_grad()
def full_ranks(
    split: Split,
    scores_of: Scores,
    users: np.ndarray | None = None,
    offsets: Mapping[str, Tensor] | None = None,
) -> dict[str, dict[str, Tensor]]:
    """0-based ranks of ``users``' test items (``"test"``) and validation items (``"val"``, when
    the split holds them) among every item the user has not interacted with, by the scores
    (``"model"``) and by the scores plus each of ``offsets`` (one value per item, e.g. a prior
    at a weight), under its name: variant -> held-out set -> (U,)."""
    users = np.arange(split.n_users) if users is None else np.asarray(users, dtype=np.int64)
    held = {"test": split.test_items}
    if split.val_items is not None:
        held["val"] = split.val_items
    shifts: dict[str, Tensor | None] = {"model": None, **(offsets or {})}
    out = {v: {name: torch.empty(len(users), dtype=torch.int64) for name in held} for v in shifts}
    for start in range(0, len(users), USERS_PER_CHUNK):
        part = users[start : start + USERS_PER_CHUNK]
        logits = scores_of(part)
        known = torch.zeros(logits.shape, dtype=torch.bool)
        counts = split.train_indptr[part + 1] - split.train_indptr[part]
        rows = torch.from_numpy(np.repeat(np.arange(len(part)), counts))
        cols = torch.from_numpy(np.concatenate([split.user_train(int(u)) for u in part]))
        known[rows, cols.to(torch.int64)] = True
        here = torch.arange(len(part))
        targets = {n: torch.from_numpy(held[n][part]).to(torch.int64) for n in held}
        for name, target in targets.items():
            others = known.clone()
            for other, item in targets.items():  # the user's other held-out item is known too
                if other != name:
                    others[here, item] = True
            others[here, target] = False
            for variant, shift in shifts.items():
                scores = logits if shift is None else logits + shift
                pos = scores[here, target]
                beaten = (scores >= pos[:, None]) & ~others
                out[variant][name][start : start + len(part)] = beaten.sum(1) - 1  # not itself
    return out


def full_metrics(
    split: Split,
    scores_of: Scores,
    users: np.ndarray | None = None,
    offsets: Mapping[str, Tensor] | None = None,
    ks: tuple[int, ...] = KS,
) -> dict[str, dict[str, float]]:
    """Mean HR@K and NDCG@K of the full ranking (validation metrics under ``val/``), by the
    scores (``"model"``) and with each of ``offsets`` (:func:`full_ranks`)."""
    out: dict[str, dict[str, float]] = {}
    for variant, sets in full_ranks(split, scores_of, users, offsets).items():
        out[variant] = {}
        for name, ranks in sets.items():
            prefix = "" if name == "test" else "val/"
            for metric, values in per_user_metrics(ranks, ks).items():
                out[variant][prefix + metric] = float(values.mean()) if len(values) else 0.0
    return out


def model_scores(scorer: Scorer, private: dict[str, Tensor]) -> Scores:
    """The model's logits for every item (``private``: the rows of all users, by user id), as
    :meth:`fedrecgel.model.Scorer.score_all` computes them."""

    def scores(users: np.ndarray) -> Tensor:
        idx = torch.from_numpy(users)
        return scorer.score_all({k: v[idx] for k, v in private.items()})

    return scores


def fixed_scores(values: np.ndarray | Tensor) -> Scores:
    """One score per item for every user (a popularity count, say)."""
    row = torch.as_tensor(values, dtype=torch.float64)

    def scores(users: np.ndarray) -> Tensor:
        return row.expand(len(users), len(row))

    return scores


class ServedModel:
    """The model of the round a run serves, kept as the run goes: the round of the best
    validation HR@10 of the model's own ranking (the first of a tie, as
    :meth:`fedrecgel.simulate.RunResult.selected` picks), with the prior's weight that round's
    evaluation chose."""

    def __init__(self) -> None:
        self.val: float | None = None
        self.round = 0
        self.weight = 0.0
        self.scorer: Scorer | None = None
        self.private: dict[str, Tensor] = {}

    def offer(self, rec: RoundRecord, scorer: Scorer, private: dict[str, Tensor]) -> None:
        """Keep a copy of an evaluated round's model (``private``: every user's rows) when its
        validation figure is the best so far."""
        val = (rec.model_val or rec.val).get("hr@10")
        if val is None or (self.val is not None and val <= self.val):
            return
        shared = {k: v.clone() for k, v in scorer.shared.items()}
        self.val, self.round, self.weight = val, rec.round, rec.prior_weight or 0.0
        self.scorer = Scorer(scorer.cfg, shared)
        self.private = {k: v.clone() for k, v in private.items()}

    def follow(self, sim: Simulator) -> Callable[[RoundRecord], None]:
        """An ``on_round`` for ``sim.run`` that offers each evaluated round's model."""
        users = np.arange(sim.split.n_users)

        def on_round(rec: RoundRecord) -> None:
            if rec.val:
                self.offer(rec, Scorer(sim.model_cfg, sim.shared), sim.ranking_params(users))

        return on_round

    def ranked(self, split: Split) -> dict[str, Any]:
        """The kept model over the whole catalogue: alone (``model``), with the prior at the
        weight its round chose (``served``), and at the weight the full ranking's validation
        items choose among the same weights (``full_weight``, ``served_full_weight``)."""
        if self.scorer is None:
            raise ValueError("no evaluated round with validation items was kept")
        prior = split_prior(split)
        if prior is None:
            raise ValueError(f"{split.name}: the full ranking's prior needs validation items")
        offsets = {f"{w:g}": w * prior for w in PRIOR_WEIGHTS if w}
        full = full_metrics(split, model_scores(self.scorer, self.private), offsets=offsets)
        by_weight = {0.0: full["model"], **{w: full[f"{w:g}"] for w in PRIOR_WEIGHTS if w}}
        chosen = max(by_weight, key=lambda w: by_weight[w]["val/hr@10"])  # the first of a tie
        pick = {w: kept_figures(m) for w, m in by_weight.items()}
        return {
            "round": self.round,
            "weight": self.weight,
            "model": pick[0.0],
            "served": pick[self.weight],
            "full_weight": chosen,
            "served_full_weight": pick[chosen],
        }


def whole_catalogue(split: Split, served: ServedModel) -> dict[str, Any]:
    """``served.ranked(split)`` with popularity's figures on the same ranking."""
    from fedrecgel.baselines import item_popularity

    pop = full_metrics(split, fixed_scores(item_popularity(split)))["model"]
    return {**served.ranked(split), "popularity": kept_figures(pop)}


def full_ranking_line(full: dict[str, Any]) -> str:
    """One line of a run's :func:`whole_catalogue` figures."""
    served = full["served"]["hr@10"]
    at = f"served (prior weight {full['weight']:g}) {served:.4f}, " if full["weight"] else ""
    return (
        f"whole catalogue, round {full['round']}: HR@10 model {full['model']['hr@10']:.4f}, "
        f"{at}with the prior weight chosen on it ({full['full_weight']:g}) "
        f"{full['served_full_weight']['hr@10']:.4f}; popularity {full['popularity']['hr@10']:.4f}"
    )
