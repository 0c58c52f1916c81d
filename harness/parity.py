"""The simulator's run over HTTP: the aggregator and client workers as local processes,
started through the launcher's helpers (what ``fedrec up`` uses), with the options under which
the run computes what :class:`~fedrecgel.simulate.Simulator` computes. Used by the end-to-end
tests and by ``bench/http_vs_simulator.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedrecgel.simulate import RoundRecord, TrainConfig
from harness.loopback import free_port
from services.launcher import Cluster, UpOptions, cluster


def parity_options(
    train: TrainConfig,
    dataset: str,
    workdir: Path,
    *,
    rounds: int | None = None,
    **options: Any,
) -> UpOptions:
    """``fedrec up`` options of ``train``'s run over HTTP on ``dataset`` (``rounds``: another
    length), without recommend_api, on a free aggregator port; ``options`` are other
    :class:`~services.launcher.UpOptions` fields.

    No round may hit its deadline, even on a slow machine: a retried round draws another
    cohort, which the simulator does not.
    """
    length = {} if rounds is None else {"rounds": rounds}
    options.setdefault("validation", False)  # the reference splits hold no validation items
    return UpOptions(
        run=train.run_params(dataset=dataset, deadline_s=3600.0, **length),
        aggregator_port=free_port(),
        workdir=workdir,
        recommend=False,
        startup_timeout_s=300.0,
        **options,
    )


@contextlib.contextmanager
def aggregator_started(opts: UpOptions) -> Iterator[Cluster]:
    """A started aggregator process (no workers yet); everything is stopped at the end."""
    opts.workdir.mkdir(parents=True, exist_ok=True)
    with cluster(opts) as c:
        c.start_aggregator()
        yield c


def start_workers(c: Cluster, n_users: int) -> None:
    """Start every worker and wait until they registered all ``n_users`` clients."""
    for i in range(c.opts.workers):
        c.start_worker(i)
    c.wait_registered(n_users)


def served_and_model(rec: RoundRecord) -> dict[str, float]:
    """The test figures an aggregator publishes for a simulated evaluation: the served
    ranking's under the plain names and, when the popularity prior was ranked, the model's
    own under ``model/`` (:func:`services.aggregator.evaluation.served_metrics`)."""
    if rec.prior_weight is None:
        return dict(rec.test)
    return {**rec.test, **{f"model/{k}": v for k, v in rec.model_test.items()}}
