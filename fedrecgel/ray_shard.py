"""One shard of the users, as a Ray actor holds it: the shard's data, its users' private state,
and a checkpoint of that state after each round (``fedrec train --backend ray``).

Shard ``s`` of ``S`` holds the users with ``id % S == s``, as the simulator's ``shards`` and
the client workers split them. Nothing here imports Ray: :class:`ShardActor` is a plain class
that :mod:`fedrecgel.ray_backend` wraps with ``ray.remote`` (and the tests may call directly).

A round is two calls: :meth:`ShardActor.train` computes the shard's partial sum and keeps the
new private state aside; :meth:`ShardActor.commit`, once the driver has every shard's partial
sum, stores it and writes the checkpoint (a safetensors file, written to a temporary file and
renamed over the last one, owner-only since it holds private vectors). An actor that dies at
any point is started again from its checkpoint, which holds the state after the last round it
committed, and the driver redoes what was lost from the same keyed random streams.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_tensors
from torch import Tensor

from fedrecgel.client_round import ClientRound
from fedrecgel.config import Weighting
from fedrecgel.data import Split
from fedrecgel.metrics import KS, metric_sums
from fedrecgel.model import ModelConfig, Scorer
from fedrecgel.private_store import PrivateStore
from fedrecgel.rank_fit import RankFit, ranking_params
from fedrecgel.sam import PrivateState, SAMConfig
from fedrecgel.uploads import PartialSum

#: where a shard actor can be made to kill its own process (fault-injection tests)
CrashPhase = Literal["train", "commit"]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or belongs to another shard layout."""


@dataclass(frozen=True)
class ShardData:
    """The part of a split one shard needs: its users' training items (CSR over the shard's
    users, in id order) and their held-out items with their negatives."""

    shard: int
    shards: int
    n_users: int
    n_items: int
    users: np.ndarray  # ascending global ids, id % shards == shard
    train_indptr: np.ndarray
    train_items: np.ndarray
    test_items: np.ndarray
    test_negatives: np.ndarray
    val_items: np.ndarray | None
    val_negatives: np.ndarray | None

    @staticmethod
    def of(split: Split, shard: int, shards: int) -> ShardData:
        """Shard ``shard`` of ``shards`` of ``split``."""
        users = np.arange(shard, split.n_users, shards, dtype=np.int64)
        starts = split.train_indptr[users].astype(np.int64)
        lengths = split.train_indptr[users + 1].astype(np.int64) - starts
        indptr = np.zeros(len(users) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        rows = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1], dtype=np.int64)
        return ShardData(
            shard=shard,
            shards=shards,
            n_users=split.n_users,
            n_items=split.n_items,
            users=users,
            train_indptr=indptr,
            train_items=split.train_items[rows],
            test_items=split.test_items[users],
            test_negatives=split.test_negatives[users],
            val_items=None if split.val_items is None else split.val_items[users],
            val_negatives=None if split.val_negatives is None else split.val_negatives[users],
        )

    def user_train(self, user: int) -> np.ndarray:
        """Training items of the shard's ``user`` (a global id), as :meth:`Split.user_train`."""
        if user % self.shards != self.shard:
            raise ValueError(f"user {user} is not in shard {self.shard} of {self.shards}")
        local = user // self.shards
        return self.train_items[self.train_indptr[local] : self.train_indptr[local + 1]]


def checkpoint_path(folder: Path, shard: int, shards: int) -> Path:
    """The checkpoint file of shard ``shard`` of ``shards`` in ``folder``."""
    return folder / f"shard-{shard}-of-{shards}.safetensors"


def save_checkpoint(
    path: Path,
    store: PrivateStore,
    meta: dict[str, str],
    before_rename: Callable[[], None] | None = None,
) -> None:
    """The state of every user ``store`` holds, with ``meta``, written to ``path`` whole or not
    at all (temporary file in the same folder, flushed, renamed over ``path``;
    ``before_rename`` runs in between)."""
    users = np.flatnonzero(store.slot >= 0).astype(np.int64)
    state = store.get(users)
    tensors: dict[str, Tensor] = {"users": torch.from_numpy(users), "step": state.step}
    for part, values in (
        ("params", state.params),
        ("exp_avg", state.exp_avg),
        ("exp_avg_sq", state.exp_avg_sq),
    ):
        tensors.update({f"{part}.{k}": v.contiguous() for k, v in values.items()})
    body = save_tensors(tensors, metadata=meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_checkpoint(path: Path) -> tuple[dict[str, str], np.ndarray, PrivateState]:
    """(metadata, users, their state) of a checkpoint file."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = dict(fh.metadata() or {})
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a dict)
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"cannot read the checkpoint {path}: {err}") from None

    def group(part: str) -> dict[str, Tensor]:
        prefix = f"{part}."
        return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

    if "users" not in tensors or "step" not in tensors:
        raise CheckpointError(f"{path} is not a shard checkpoint (no users or step)")
    state = PrivateState(
        params=group("params"),
        exp_avg=group("exp_avg"),
        exp_avg_sq=group("exp_avg_sq"),
        step=tensors["step"],
    )
    return meta, tensors["users"].numpy(), state


class ShardActor:
    """One shard's data and private state, training and evaluating it round by round.

    ``run_id`` names the run: a checkpoint of another run in ``folder`` is never loaded.
    ``resume``: start from this run's checkpoint in ``folder`` (when there is one), else from
    the users' initial state. ``crash``: (round, phase) at which this actor kills its own
    process with SIGKILL, for the fault tests.
    """

    def __init__(
        self,
        data: ShardData,
        model: ModelConfig,
        hp: SAMConfig,
        seed: int,
        weighting: Weighting,
        folder: str,
        run_id: str,
        resume: bool,
        crash: tuple[int, CrashPhase] | None = None,
    ) -> None:
        torch.set_grad_enabled(False)
        self.data = data
        self.model = model
        self.weighting = weighting
        self.clients = ClientRound(model, hp, seed)
        self.store = PrivateStore(model, seed, data.n_users)
        self.path = checkpoint_path(Path(folder), data.shard, data.shards)
        self.meta = {
            "run": run_id,
            "shard": str(data.shard),
            "shards": str(data.shards),
            "seed": str(seed),
        }
        self.crash = crash
        #: the last round whose new private state this shard stored (and checkpointed)
        self.round = 0
        self.pending: tuple[int, np.ndarray, PrivateState] | None = None
        for left in self.path.parent.glob(f".{self.path.name}.*"):
            left.unlink(missing_ok=True)  # a temporary file of a writer that died
        if resume and self.path.exists():
            self.round = self._load()

    def _load(self) -> int:
        meta, users, state = read_checkpoint(self.path)
        if meta.get("run") != self.meta["run"]:
            return 0  # an earlier run's file: this run has not checkpointed this shard yet
        if meta != {**self.meta, "round": meta.get("round", "")}:
            raise CheckpointError(f"{self.path} is not shard {self.meta} of this run: {meta}")
        if len(users):
            self.store.put(users, state)
        return int(meta["round"])

    def ready(self) -> dict[str, int]:
        """The round this shard's state is at (0: initial) and this actor's process id."""
        return {"round": self.round, "pid": os.getpid()}

    def train(self, round_id: int, shared: dict[str, Tensor], users: Sequence[int]) -> PartialSum:
        """The partial sum of the shard's cohort members ``users`` (ascending) at ``round_id``;
        their new private state is kept until :meth:`commit`."""
        if round_id <= self.round:
            raise RuntimeError(f"shard {self.data.shard} already stored round {round_id}")
        ids = np.asarray(users, dtype=np.int64)
        with torch.no_grad():
            res = self.clients.partial_step(
                shared, round_id, ids, self.data.user_train, self.store.get(ids), self.weighting
            )
        self.pending = (round_id, ids, res.state)
        self._maybe_crash(round_id, "train")
        assert res.partial is not None
        return res.partial

    def commit(self, round_id: int) -> int:
        """Store round ``round_id``'s new private state and checkpoint it (nothing to do when
        that is done already: a repeated call after a lost reply)."""
        if self.round == round_id:
            return round_id
        if self.pending is None or self.pending[0] != round_id:
            raise RuntimeError(
                f"shard {self.data.shard} has no state of round {round_id} to store "
                f"(its state is at round {self.round})"
            )
        _, ids, state = self.pending
        self.store.put(ids, state)
        self._save(round_id)
        self.round, self.pending = round_id, None
        return round_id

    def _save(self, round_id: int) -> None:
        save_checkpoint(
            self.path,
            self.store,
            {**self.meta, "round": str(round_id)},
            before_rename=lambda: self._maybe_crash(round_id, "commit"),
        )

    def _maybe_crash(self, round_id: int, phase: CrashPhase) -> None:
        if self.crash == (round_id, phase):
            os.kill(os.getpid(), signal.SIGKILL)

    def evaluate(
        self,
        shared: dict[str, Tensor],
        prior: Tensor | None = None,
        version: int = 0,
        fit: RankFit | None = None,
    ) -> tuple[dict[str, float], dict[str, float] | None]:
        """Metric sums (test, and validation when the split has it) over the shard's users,
        with the popularity ``prior``'s rankings when one is given; with ``fit``, each user's
        embeddings fitted to model ``version`` first (:func:`fedrecgel.rank_fit.ranking_params`)."""
        d = self.data
        with torch.no_grad():
            scorer = Scorer(self.model, shared)
            if fit is not None and fit.steps:
                state = self.store.get(d.users)
                seed = self.clients.seed
                hp = self.clients.hp
                params = ranking_params(
                    self.model, shared, state, d.users, d.user_train, hp, fit, seed, version
                )
            else:
                params = self.store.params(d.users)
            test = metric_sums(scorer, params, d.test_items, d.test_negatives, KS, prior=prior)
            val = None
            if d.val_items is not None and d.val_negatives is not None:
                val = metric_sums(scorer, params, d.val_items, d.val_negatives, KS, prior=prior)
        return test, val
