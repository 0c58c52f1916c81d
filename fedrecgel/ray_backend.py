"""``fedrec train --backend ray``: the simulator's rounds with each shard of users in a Ray actor.

One long-lived actor per shard (:class:`fedrecgel.ray_shard.ShardActor`; shard ``s`` of ``S``
holds the users with ``id % S == s``) keeps that shard's data and its users' private state. The
driver (:class:`RaySimulator`, the in-process :class:`~fedrecgel.simulate.Simulator` with its
client step moved out) draws each round's cohort as the simulator does, puts the shared
parameters into the object store once, and each actor computes its cohort members' partial sum
(``upload_grouping=worker``: :meth:`fedrecgel.client_round.ClientRound.partial_step`). The
driver combines them in first-client order (:class:`fedrecgel.upload_modes.PerWorker`), takes
the server step, and has every actor that trained store its new state and checkpoint it;
evaluation sums each shard's metric sums. The run is the in-process simulator's with the same
``shards`` and ``upload_grouping="worker"``, bit for bit.

An actor that dies (killed, its process or node lost) is started again from its checkpoint and
the work it lost is redone from the same keyed random streams, so the run ends with the model of
an undisturbed one. Refused: differential privacy, secure aggregation and server-side clipping,
which need each client's own update, not a shard's sum.

Ray is an optional dependency (``pip install 'fedrecgel[distributed]'``); it is imported only
when this backend runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedrecgel.data import Split
from fedrecgel.metrics import means
from fedrecgel.ray_shard import CrashPhase, ShardActor, ShardData
from fedrecgel.run_config import rank_fit_of
from fedrecgel.simulate import Simulator, TrainConfig, _add
from fedrecgel.upload_modes import RoundUploads
from fedrecgel.uploads import PartialSum

log = logging.getLogger(__name__)

#: seconds to wait for the shard actors to start (and for a restarted one)
START_TIMEOUT_S = 300.0


class ShardLost(RuntimeError):
    """A shard's actor kept dying: the run cannot go on."""


def ray_missing() -> str | None:
    """Why Ray cannot be used here (None when it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "the ray backend needs Ray: pip install 'fedrecgel[distributed]'"
    return None


def refusal(config: TrainConfig) -> str | None:
    """Why ``config`` cannot run on the ray backend (None when it can): each actor uploads its
    shard's sum, so nothing that needs each client's own update."""
    for on, what in (
        (
            config.dp_enabled,
            "differential privacy (each client's update is clipped before it is summed)",
        ),
        (config.secure_aggregation != "off", "secure aggregation (each client is masked)"),
        (config.clip is not None, "clip (the server clips each client's update)"),
    ):
        if on:
            return f"the ray backend uploads one sum per shard and cannot run {what}"
    if config.upload_grouping != "worker":
        return (
            "the ray backend sums each shard's clients inside its actor: upload_grouping must "
            "be worker (per-client uploads are not sent through the actors)"
        )
    return None


@contextmanager
def ray_cluster(address: str | None, shards: int) -> Iterator[dict[str, float]]:
    """Ray for the duration of the block: joins the cluster at ``address`` (``auto``: the one
    ``ray start --head`` started on this machine), else starts a local one with a CPU per shard,
    no dashboard and the workers' output kept out of the driver's. Yields the cluster's
    resources; shuts Ray down at the end."""
    import ray

    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if address is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=shards, **quiet)  # type: ignore[arg-type]
    else:
        ray.init(address=address, **quiet)  # type: ignore[arg-type]
    try:
        yield dict(ray.cluster_resources())  # type: ignore[no-untyped-call]  # ray: unannotated
    finally:
        ray.shutdown()


class RaySimulator(Simulator):
    """:class:`Simulator` whose client step runs in one Ray actor per shard (Ray must be
    initialised). ``checkpoint_dir``: where the actors write their checkpoints (on storage
    every node sees when the cluster has several). ``crash``: shard -> (round, phase) at which
    that shard's first actor kills its process (fault tests). ``max_restarts``: how often one
    call may lose its actor before the run gives up. Use it as a context manager (or call
    :meth:`close`) so that the actors end with the run."""

    def __init__(
        self,
        split: Split,
        config: TrainConfig,
        checkpoint_dir: Path,
        crash: Mapping[int, tuple[int, CrashPhase]] | None = None,
        max_restarts: int = 3,
    ) -> None:
        import ray

        super().__init__(split, config)
        reason = refusal(config)
        if reason is not None:
            raise ValueError(reason)
        n = config.shards
        cpus = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        if cpus < n:
            raise ValueError(
                f"{n} shards need {n} CPUs in the Ray cluster (an actor each); it has {cpus:g}"
            )
        self.folder = Path(checkpoint_dir).resolve()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"cannot make the checkpoint folder {self.folder}: {err.strerror or err}"
            ) from None
        self.run_id = uuid.uuid4().hex
        self.max_restarts = max_restarts
        self._remote = ray.remote(num_cpus=1, max_restarts=0)(ShardActor)
        self._data = [ray.put(ShardData.of(split, s, n)) for s in range(n)]
        #: per shard: the last round whose state it stored (what its checkpoint holds)
        self.committed = [0] * n
        #: per shard: how many times its actor was started again
        self.restarts = [0] * n
        self.actors: list[Any] = []
        crash = dict(crash or {})
        try:
            self.actors = [self._start(s, False, crash.get(s)) for s in range(n)]
            ready = ray.get([a.ready.remote() for a in self.actors], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise ShardLost(
                f"the {n} shard actors did not start within {START_TIMEOUT_S:g} s"
            ) from None
        except ray.exceptions.RayActorError as err:
            self.close()
            raise ShardLost(f"a shard actor could not start: {_why(err)}") from None
        except BaseException:
            self.close()
            raise
        #: per shard: its actor's process id (the fault tests kill it)
        self.pids = [info["pid"] for info in ready]

    def _start(self, shard: int, resume: bool, crash: tuple[int, CrashPhase] | None) -> Any:
        cfg = self.config
        return self._remote.remote(
            self._data[shard],
            self.model_cfg,
            self.hp,
            cfg.seed,
            cfg.weighting,
            str(self.folder),
            self.run_id,
            resume,
            crash,
        )

    def close(self) -> None:
        """End the actors (their checkpoints stay)."""

        for actor in self.actors:
            _kill(actor)
        self.actors = []

    def __enter__(self) -> RaySimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restart(self, shard: int, rounds: set[int]) -> int:
        """Start shard ``shard``'s actor again from its checkpoint; the round it holds, which
        must be one of ``rounds``."""
        import ray

        _kill(self.actors[shard])
        self.restarts[shard] += 1
        self.actors[shard] = self._start(shard, True, None)
        try:
            info = ray.get(self.actors[shard].ready.remote(), timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            why = _why(err)
            raise ShardLost(f"shard {shard}'s actor could not be started again: {why}") from None
        self.pids[shard] = info["pid"]
        log.warning("shard %d: actor started again at round %d", shard, info["round"])
        if info["round"] not in rounds:
            raise ShardLost(
                f"shard {shard}'s checkpoint in {self.folder} is at round {info['round']}, "
                f"expected {' or '.join(map(str, sorted(rounds)))} (is the checkpoint folder "
                "on storage every node of the cluster sees?)"
            )
        return int(info["round"])

    def _each(
        self,
        shards: Iterable[int],
        call: Callable[[int], Any],
        recover: Callable[[int, int], Any] | None = None,
        rounds: Callable[[int], set[int]] | None = None,
    ) -> dict[int, Any]:
        """``call(s)`` on each of ``shards``' actors at once, and their results; an actor lost on
        the way is started again (its checkpoint at one of ``rounds(s)``, default the last
        committed) and ``recover(s, round it holds)`` (default ``call(s)``) is submitted to it
        instead."""
        import ray
        from ray.exceptions import RayActorError

        refs = {s: call(s) for s in shards}
        out: dict[int, Any] = {}
        for s, ref in refs.items():
            for attempt in range(self.max_restarts + 1):
                try:
                    out[s] = ray.get(ref)
                    break
                except RayActorError as err:
                    if attempt == self.max_restarts:
                        raise ShardLost(
                            f"shard {s}'s actor died {attempt + 1} times in one call: {_why(err)}"
                        ) from None
                    at = self._restart(s, rounds(s) if rounds else {self.committed[s]})
                    ref = call(s) if recover is None else recover(s, at)
        return out

    def _train(self, r: int, cohort: np.ndarray) -> float:
        """Each shard's partial sum from its actor, combined as the upload mode combines them
        (in first-client order); the server step; then the actors that trained store their new
        state and checkpoint it."""
        import ray

        n = self.config.shards
        ordered = np.sort(cohort)
        parts = {s: ordered[ordered % n == s] for s in range(n)}
        parts = {s: p for s, p in parts.items() if len(p)}
        if not parts:  # an empty Poisson cohort: no step (the simulator's rule)
            return float("nan")
        shared = ray.put(self.shared)

        def train(s: int) -> Any:
            return self.actors[s].train.remote(r, shared, parts[s])

        got: dict[int, PartialSum] = self._each(parts, train)
        shapes = {k: tuple(v.shape) for k, v in self.shared.items()}
        agg = self.mode.combine(self.strategy, shapes, RoundUploads(r, [got[s] for s in parts]))
        assert agg is not None
        agg.apply(self.strategy, self.shared)

        def after_restart(s: int, at: int) -> Any:
            if at == r:  # lost after its checkpoint was renamed into place: nothing to redo
                return ray.put(r)
            # lost before: train the round again (the same partial sum, from the same keyed
            # streams and the round's parameters), then store it
            train(s)
            return self.actors[s].commit.remote(r)

        self._each(
            parts,
            lambda s: self.actors[s].commit.remote(r),
            recover=after_restart,
            rounds=lambda s: {self.committed[s], r},
        )
        for s in parts:
            self.committed[s] = r
        return agg.loss

    def evaluate(self) -> tuple[dict[str, float], dict[str, float]]:
        """Test (and validation) metrics: each shard's metric sums, added in shard order."""
        import ray

        shared = ray.put(self.shared)
        shards = [s for s in range(self.config.shards) if s < self.split.n_users]
        fit = rank_fit_of(self.config)
        got = self._each(
            shards,
            lambda s: self.actors[s].evaluate.remote(shared, self.prior, self.round_id, fit),
        )
        test: dict[str, float] = {}
        val: dict[str, float] = {}
        for s in shards:
            t, v = got[s]
            _add(test, t)
            if v is not None:
                _add(val, v)
        return means(test), (means(val) if val else {})


def _kill(actor: Any) -> None:
    """End ``actor`` for good (nothing when it is gone already)."""
    import ray

    with contextlib.suppress(ray.exceptions.RayError, ValueError):
        ray.kill(actor, no_restart=True)


def _why(err: Exception) -> str:
    """One line of what Ray said about a lost actor: the exception its constructor raised (the
    last line of the remote traceback Ray quotes), else the first line of its report."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if getattr(err, "actor_init_failed", False) else lines[0]
