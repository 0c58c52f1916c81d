"""Ranking with embeddings fitted to the model: before a user ranks a model version, it may take
Adam steps on a copy of its private parameters against that version
(:attr:`fedrecgel.config.RunParams.rank_fit_steps`).

A user's private parameters move only in the rounds it takes part in. With cohorts of a small
fraction of the users, most users have taken part in few rounds, or none, and their stored
embeddings were fitted to an old model or not at all: a model that has learned what users like
is then ranked with embeddings that cannot express it. The fit happens on the user's side,
from its own training items, and leaves nothing behind: the stored state, the uploads and the
privacy accounting are those of the run without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.private_steps import PrivateState, fit_private_, groups_of
from fedrecgel.sam import SAMConfig
from fedrecgel.sampling import cohort_samples

#: the key of the samples a user fits on before ranking, apart from every training round's
FIT_STREAM = 0xF17
#: users fitted together hold at most this many samples (one user may exceed it): few enough
#: rows in memory at a time, enough that a group's tensor work outweighs its Python overhead
FIT_GROUP_SAMPLES = 1 << 16


@dataclass(frozen=True)
class RankFit:
    """How users fit their private parameters to a model before ranking with it
    (:attr:`fedrecgel.config.RunParams.rank_fit_steps`): those whose parameters took fewer than
    ``steps`` private steps in training take ``steps`` Adam steps of ``lr``."""

    steps: int = 0
    lr: float = 0.05


def needs_fit(state: PrivateState, fit: RankFit) -> np.ndarray:
    """Positions (in ``state``) of the users :func:`ranking_params` fits: those whose private
    parameters took fewer than ``fit.steps`` steps in training."""
    todo: np.ndarray = np.flatnonzero(state.step.numpy() < fit.steps)
    return todo


def ranking_params(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    state: PrivateState,
    user_ids: np.ndarray,
    train_items: Callable[[int], np.ndarray],
    hp: SAMConfig,
    fit: RankFit,
    seed: int,
    version: int,
) -> dict[str, Tensor]:
    """The private parameters ``user_ids`` rank model ``version`` with: their stored ones
    (``state``, in that order), but for the users whose stored ones took fewer than
    ``fit.steps`` private steps in training (they took part in few rounds, or none), whose
    copies are fitted to the model first.

    Such a user takes ``fit.steps`` Adam steps of ``fit.lr`` on its own parameters, continuing
    its own Adam state, on its training items and ``hp.n_negatives`` negatives a positive
    drawn from the whole catalogue (keyed by the seed, the version and the user, so that any
    shard of users computes the same values), the shared parameters fixed. ``state`` is left
    as it is: what is fitted here is neither stored nor uploaded. Users go in groups of at
    most :data:`FIT_GROUP_SAMPLES` samples, one group at a time (the memory of one group's
    rows). A user that took part in many rounds has embeddings fitted to a recent model
    already, and fitting them again to its few training items only overfits them (measured
    in ``bench/rank_fit.py``): its stored ones are ranked.
    """
    todo = needs_fit(state, fit)
    if len(todo) == 0:
        return state.params
    users = np.asarray(user_ids, dtype=np.int64)[todo]
    samples = cohort_samples(
        [train_items(int(u)) for u in users],
        cfg.n_items,
        hp.n_negatives,
        [np.random.default_rng([int(seed), FIT_STREAM, int(version), int(u)]) for u in users],
    )
    sizes = np.fromiter((len(s[0]) for s in samples), dtype=np.int64, count=len(samples))
    step_hp = replace(hp, local_steps=fit.steps, client_lr=fit.lr)
    out = {k: v.clone() for k, v in state.params.items()}
    for start, stop in groups_of(sizes, True, FIT_GROUP_SAMPLES):
        rows = torch.from_numpy(todo[start:stop])
        part = state.select(rows)
        fit_private_(cfg, shared, part, samples[start:stop], [(0, stop - start)], step_hp)
        for k, v in part.params.items():
            out[k][rows] = v
    return out
