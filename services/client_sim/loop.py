"""A worker's life: register (waiting out an aggregator that is not up yet), then step round
after round until the run is over, waiting between polls; an aggregator that does not answer
is waited out by the services' retry policy (:mod:`services.retry`).

After a step whose upload left its round open for other workers' uploads, the worker waits
before it polls again: the round closes only after them (a version event, or the next poll,
tells when), and a poll at once would only find it open, on an aggregator that is taking those
uploads and the close.
"""

from __future__ import annotations

import logging
from typing import Any

from services.client_sim.server import DeviceApiServer, serve_in_thread
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.retry import RetryPolicy

log = logging.getLogger(__name__)


def patience(worker: Worker) -> RetryPolicy:
    """The worker loop's retry policy (:mod:`services.retry`): the aggregator unavailable
    (each request having given up) is waited out without end, from ``poll_min_s`` doubling up
    to ``poll_max_s`` with jitter, on the worker's waiter (a version event ends a wait)."""
    s = worker.settings
    return RetryPolicy(
        retries=None,
        give_up_after_s=None,
        backoff_s=s.poll_min_s,
        max_backoff_s=s.poll_max_s,
        sleep=worker.waiter.wait,
    )


def register_patiently(worker: Worker) -> None:
    """Register, waiting out an aggregator that is not up yet (a deployment starts its pods
    in any order); a refusal (e.g. 409) still ends the worker."""
    patience(worker).call(worker.register, what="cannot register yet")


def follow_rounds(worker: Worker) -> None:
    """Register, then step until :meth:`Worker.finished`.

    A step failing on an unavailable aggregator is tried again by :func:`patience`; between
    steps that found nothing to do the poll interval grows x1.5 from ``poll_min_s`` to
    ``poll_max_s`` (a poll, not a retry: its length is the run's pace)."""
    register_patiently(worker)
    s = worker.settings
    steps = patience(worker)
    delay = s.poll_min_s
    while True:
        did = steps.call(worker.step, what="aggregator unavailable")
        if worker.finished():
            log.info(
                "stopping: evaluated version %d, state %s",
                worker.evaluated_version(),
                worker.last_info.state if worker.last_info else "?",
            )
            return
        if did:
            delay = s.poll_min_s
            if not worker.left_open:
                continue
        with worker.timer.phase("wait"):
            worker.waiter.wait(delay)
        delay = min(s.poll_max_s, delay * 1.5)


def run_worker(settings: WorkerSettings, **kwargs: Any) -> None:
    """Run a worker until the run finishes (or ``max_rounds``); kwargs go to :class:`Worker`.

    With ``http_port`` set, the device API (:mod:`services.client_sim.server`) is served from a
    background thread over the worker's own store for as long as the worker runs.
    """
    worker = Worker(settings, **kwargs)
    server: DeviceApiServer | None = None
    try:
        if settings.http_port is not None:
            split, fitted = kwargs.get("split"), worker.evaluation.fitted_vector
            server = serve_in_thread(settings, worker.store, split=split, fitted=fitted)
        follow_rounds(worker)
    finally:
        if server is not None:
            server.stop()
        worker.close()
