"""Model versions in memory: the encoded versions served to readers (an LRU of
:class:`~services.contract.ModelBlob`) and the live params + server optimizer of the newest
version, which the next close steps in place."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor

from fedrecgel.server_strategy import strategy_of
from fedrecgel.strategy import Strategy
from fedrecgel.wire import decode_model, decode_state
from services.aggregator.models import OPTIMIZER_STATE, PARAMS
from services.aggregator.privacy import private_strategy, run_plan
from services.aggregator.repository import Repository
from services.aggregator.schemas import RunConfig
from services.contract import ModelBlob

log = logging.getLogger(__name__)


@dataclass
class ModelState:
    """Live shared params and strategy of one version.

    The closing transaction takes it out of the store (:meth:`ModelStore.take_state`) and steps
    it in place (no copies of the params or the optimizer state); only after that transaction
    committed is it put back as the next version. If the transaction fails, nobody holds it any
    more and the next close rebuilds it from the newest version row.
    """

    run_id: int
    version: int
    params: dict[str, Tensor]
    strategy: Strategy


class ModelStore:
    """The encoded-version LRU and the live model state of one aggregator instance.

    Locking: ``_lock`` guards ``_blobs`` and ``_state`` and is held only to read or swap them,
    never during database I/O or maths; a state being stepped has been taken out, so no other
    thread can see it half-stepped. Rebuilding a state from the database happens outside the
    lock (two threads may both rebuild the same version; the last one is kept, both equal).
    """

    def __init__(self, max_versions: int) -> None:
        self.max_versions = max_versions
        self._lock = threading.Lock()
        self._blobs: OrderedDict[tuple[int, int], ModelBlob] = OrderedDict()
        self._state: ModelState | None = None

    # ------------------------------------------------------------------ encoded versions

    def cached_blob(self, run_id: int, version: int) -> ModelBlob | None:
        """An encoded version if it is in memory (marked as recently used)."""
        with self._lock:
            hit = self._blobs.get((run_id, version))
            if hit is not None:
                self._blobs.move_to_end((run_id, version))
            return hit

    def remember(self, blob: ModelBlob) -> None:
        """Keep an encoded version, dropping the least recently used beyond the limit."""
        with self._lock:
            self._blobs[(blob.run_id, blob.version)] = blob
            self._blobs.move_to_end((blob.run_id, blob.version))
            while len(self._blobs) > self.max_versions:
                self._blobs.popitem(last=False)

    def forget(self, run_id: int, versions: list[int]) -> None:
        """Drop pruned versions (they are answered 410 from now on)."""
        with self._lock:
            for v in versions:
                self._blobs.pop((run_id, v), None)

    # ------------------------------------------------------------------ live state

    def put_state(self, state: ModelState) -> None:
        """The live state of the newest version (after its commit, or after a rebuild)."""
        with self._lock:
            self._state = state

    def state(self, repo: Repository, run_id: int, version: int, cfg: RunConfig) -> ModelState:
        """Params and strategy of a version: the live state, else rebuilt from its row."""
        with self._lock:
            cached = self._state
        if cached is not None and (cached.run_id, cached.version) == (run_id, version):
            return cached
        found = repo.version_with_blobs(run_id, version)
        blobs = {} if found is None else found[1]
        if PARAMS not in blobs or OPTIMIZER_STATE not in blobs:
            raise RuntimeError(f"model version {version} of run {run_id} is missing")
        stored_cfg, params, stored_version = decode_model(blobs[PARAMS])
        if stored_cfg != cfg.model() or stored_version != version:
            raise RuntimeError(f"model version {version} does not match its run's config")
        state, _ = decode_state(blobs[OPTIMIZER_STATE])
        strategy = strategy_of(cfg)
        strategy = private_strategy(strategy, run_plan(repo, cfg), cfg.model())
        strategy.load_state_dict(state)
        built = ModelState(run_id, version, params, strategy)
        self.put_state(built)
        log.info("rebuilt model version %d of run %d from the database", version, run_id)
        return built

    def take_state(self, repo: Repository, run_id: int, version: int, cfg: RunConfig) -> ModelState:
        """The state of a version, removed from the store: the caller steps it in place and
        puts the result back with :meth:`put_state` once it is committed."""
        taken = self.state(repo, run_id, version, cfg)
        with self._lock:
            self._state = None
        return taken
