"""``fedrec up``: the aggregator, N client workers and the recommendation API as local processes.

Everything runs on loopback with embedded defaults (SQLite files under the work directory, no
Redis unless ``--redis-url`` is given). The launcher starts the processes, waits until every
user is registered, starts a run through the operator API, shows live progress (round, updates
in, global HR@10) and stops everything on Ctrl-C, SIGTERM or SIGHUP, or at the end. It cannot
hurt a neighbour: every port is checked before anything starts, and the work directory is
locked for the life of the instance (a second ``fedrec up`` on it is refused before it touches
a file there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from fedrecgel.config import RunParams
from fedrecgel.run_config import RunConfig
from services.enrolment import enrolment_token as derive_enrolment_token
from services.history import HistoryCopy
from services.ports import AGGREGATOR_PORT, DASHBOARD_PORT, RECOMMEND_PORT, WORKER_HTTP_PORT
from services.restarts import Proc, Restarts
from services.supervise import TOKEN_FILE, LaunchError, die_with_parent, uninterrupted
from services.url_settings import MAX_THREADS

log = logging.getLogger(__name__)
console = Console(stderr=True)


def wanted_ports(opts: UpOptions) -> dict[int, str]:
    """Every port ``fedrec up`` will listen on, with what listens there (its option)."""
    named: list[tuple[int, str]] = [(opts.aggregator_port, "aggregator, --aggregator-port")]
    if opts.recommend:
        named.append((opts.recommend_port, "recommendation API, --recommend-port"))
        named += [
            (opts.worker_http_port + i, f"worker-{i} HTTP API, --worker-http-port + {i}")
            for i in range(opts.workers)
        ]
    if opts.dashboard:
        named.append((opts.dashboard_port, "dashboard, --dashboard-port"))
    out: dict[int, str] = {}
    for port, who in named:
        if port in out:
            raise LaunchError(f"port {port} is asked for twice: {out[port]} and {who}")
        if not 0 < port < 65536:
            raise LaunchError(f"port {port} ({who}) is not a TCP port")
        out[port] = who
    return out


def check_ports(opts: UpOptions) -> None:
    """Raise LaunchError naming every port that is already taken on ``opts.host``."""
    busy = []
    for port, who in wanted_ports(opts).items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # as the servers bind: a port left in TIME_WAIT is free, a listening one is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((opts.host, port))
            except OSError as err:
                busy.append(f"{port} ({who}): {err.strerror}")
    if busy:
        raise LaunchError(
            f"cannot listen on {opts.host}, port "
            + "; port ".join(busy)
            + ". Stop what uses it, or choose other ports."
        )


@dataclass
class UpOptions:
    """What ``fedrec up`` starts and runs."""

    # the federated run: dataset, rounds, hyperparameters, round deadline
    run: RunParams = field(default_factory=RunParams)
    data_dir: Path | None = None
    workers: int = 2
    validation: bool = True  # as fedrec train: the round and the prior's weight chosen on it
    host: str = "127.0.0.1"
    aggregator_port: int = AGGREGATOR_PORT
    recommend_port: int = RECOMMEND_PORT
    worker_http_port: int = WORKER_HTTP_PORT
    dashboard: bool = True
    dashboard_port: int = DASHBOARD_PORT
    workdir: Path = Path("runs/up")
    redis_url: str | None = None
    keep_running: bool = False
    recommend: bool = True
    show_users: int = 3
    startup_timeout_s: float = 120.0
    extra_env: dict[str, str] = field(default_factory=dict)
    # SQLAlchemy URL of the aggregator's database; None = ``aggregator.db`` in ``workdir``.
    database_url: str | None = None
    # Longest idle poll interval of the workers (None: the worker's default).
    worker_poll_max_s: float | None = None
    # INFO: the logs in ``workdir`` show each service's start, the rounds it closed or
    # trained and the requests it answered (at WARNING they stayed empty in a run that went
    # well)
    worker_log_level: str = "INFO"
    aggregator_log_level: str = "info"

    @property
    def dataset(self) -> str:
        """The run's dataset (the workers and recommend_api load it)."""
        return self.run.dataset

    @property
    def rounds(self) -> int:
        """The run's rounds."""
        return self.run.rounds


def answers_200(
    url: str, timeout_s: float, alive: Callable[[], None], every_s: float = 0.3
) -> bool:
    """Poll ``url`` every ``every_s`` until it answers 200 (True) or ``timeout_s`` has passed
    (False); ``alive`` is called before each poll and raises when what should answer is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return True
        time.sleep(every_s)
    return False


class Cluster:
    """The child processes of one ``fedrec up``; stops them all on exit."""

    def __init__(self, opts: UpOptions) -> None:
        self.opts = opts
        self.procs: list[Proc] = []
        self.operator_token = secrets.token_urlsafe(24)
        self.reader_token = secrets.token_urlsafe(24)
        # workers register their shard's users with tokens derived from this secret
        self.enrolment_secret = secrets.token_urlsafe(32)
        # the aggregator's population (client ids 0..n-1); None: it reads the dataset's
        self.population: int | None = None
        # with ``population``: the catalogue's size, so that a run over another is refused
        self.population_items: int | None = None
        self._history = HistoryCopy()
        # restarts dead services when set (:meth:`restart_dead_services`); else a death raises
        self.restarts: Restarts | None = None
        self.agg_url = f"http://{opts.host}:{opts.aggregator_port}"
        self.rec_url = f"http://{opts.host}:{opts.recommend_port}"
        self.dashboard_base = f"http://{opts.host}:{opts.dashboard_port}"
        self.dashboard_url = f"{self.dashboard_base}/ui/"

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        """Start ``python -m <args>`` with ``env`` added, logging to the work directory."""
        log_path = self.opts.workdir / f"{name}.log"
        full_env = {**os.environ, **self.opts.extra_env, **env}
        # append: a restarted process keeps the log of its predecessor
        with log_path.open("ab") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def restart_dead_services(self, say: Callable[[str], None]) -> Restarts:
        """From now on a service that dies is started again (:mod:`services.restarts`) by
        :meth:`check_alive` and :meth:`check_workers`, each death and restart told by ``say``;
        a worker that exits 0 has finished and stays down."""
        starters: dict[str, Callable[[], Proc]] = {
            "aggregator": lambda: self.start_aggregator(wait=False),
            "recommend_api": self.start_recommend,
            "dashboard": self.start_dashboard,
        }

        def start(name: str) -> Proc:
            if name.startswith("worker-"):
                return self.start_worker(int(name.removeprefix("worker-")))
            return starters[name]()

        self.restarts = Restarts(
            start=start, say=say, finished=lambda name, code: name.startswith("worker") and not code
        )
        return self.restarts

    def check_alive(self) -> None:
        """Raise if a child exited early (naming its log); a restarted child counts by its
        newest process. With :meth:`restart_dead_services`, restart it instead (raises when
        it failed fast too often)."""
        if self.restarts is not None:
            self.restarts.poll(
                self.latest(name) for name in dict.fromkeys(p.name for p in self.procs)
            )
            return
        for name in dict.fromkeys(p.name for p in self.procs):
            p = self.latest(name)
            code = p.popen.poll()
            if code is not None and not p.name.startswith("worker"):
                raise p.exited(code)

    def wait_healthy(self, url: str, name: str) -> None:
        """Poll ``url`` until it answers 200."""
        if not answers_200(url, self.opts.startup_timeout_s, self.check_alive):
            raise LaunchError(f"{name} did not become healthy at {url} in time")

    def stop(self) -> None:
        """SIGTERM every child, then SIGKILL what is left after a grace period (Ctrl-C, SIGTERM
        and SIGHUP are ignored meanwhile, so a second one cannot cut the cleanup short)."""
        with uninterrupted():
            self._stop()

    def _stop(self) -> None:
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            left = max(0.1, deadline - time.monotonic())
            try:
                p.popen.wait(timeout=left)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()

    # ------------------------------------------------------------------ the services

    def aggregator_env(self) -> dict[str, str]:
        """The ``FEDREC_AGG_*`` environment of the aggregator process."""
        opts = self.opts
        db = opts.database_url or f"sqlite:///{(opts.workdir / 'aggregator.db').resolve()}"
        env = {
            "FEDREC_AGG_DATABASE_URL": db,
            "FEDREC_AGG_OPERATOR_TOKEN": self.operator_token,
            "FEDREC_AGG_READER_TOKEN": self.reader_token,
            "FEDREC_AGG_HOST": opts.host,
            "FEDREC_AGG_PORT": str(opts.aggregator_port),
            "FEDREC_AGG_LOG_LEVEL": opts.aggregator_log_level,
            "FEDREC_AGG_ENROLMENT_SECRET": self.enrolment_secret,
        }
        if self.population is not None:
            env["FEDREC_AGG_POPULATION"] = str(self.population)
            if self.population_items is not None:
                env["FEDREC_AGG_POPULATION_ITEMS"] = str(self.population_items)
                # the name its workers check: a run over another dataset is refused (422)
                # instead of stopping every worker
                env["FEDREC_AGG_POPULATION_DATASET"] = opts.dataset
        else:
            env["FEDREC_AGG_POPULATION_DATASET"] = opts.dataset
            if opts.data_dir is not None:
                env["FEDREC_AGG_POPULATION_DATA_DIR"] = str(opts.data_dir)
        if opts.redis_url:
            env["FEDREC_AGG_REDIS_URL"] = opts.redis_url
        return env

    def enrolment_token(self, shard: int) -> str:
        """The enrolment token of worker ``shard``: it registers that shard's users only."""
        return derive_enrolment_token(self.enrolment_secret, shard, self.opts.workers)

    def start_aggregator(self, wait: bool = True) -> Proc:
        """Start the aggregator (again, after a crash: same database, port and tokens)."""
        proc = self.start("aggregator", ["services.aggregator"], self.aggregator_env())
        if wait:
            self.wait_healthy(f"{self.agg_url}/healthz", "aggregator")
        return proc

    def start_recommend(self) -> Proc:
        """Start the recommendation API (following the aggregator with the reader token)."""
        opts = self.opts
        env = {
            "FEDREC_REC_AGGREGATOR_URL": self.agg_url,
            "FEDREC_REC_AGGREGATOR_TOKEN": self.reader_token,
            "FEDREC_REC_DATASET": opts.dataset,
            "FEDREC_REC_HOST": opts.host,
            "FEDREC_REC_PORT": str(opts.recommend_port),
        }
        if opts.data_dir is not None:
            env["FEDREC_REC_DATA_DIR"] = str(opts.data_dir)
        if opts.redis_url:
            env["FEDREC_REC_REDIS_URL"] = opts.redis_url
        return self.start("recommend_api", ["services.recommend_api"], env)

    def start_dashboard(self) -> Proc:
        """Start the dashboard: it reads the aggregator with the reader token, the workers'
        device APIs and recommend_api (all on loopback); the operator types the operator
        token into the page."""
        opts = self.opts
        workers = (f"http://{opts.host}:{opts.worker_http_port + i}" for i in range(opts.workers))
        env = {
            "FEDREC_DASH_AGGREGATOR_URL": self.agg_url,
            "FEDREC_DASH_AGGREGATOR_TOKEN": self.reader_token,
            "FEDREC_DASH_RECOMMEND_URL": self.rec_url if opts.recommend else "",
            "FEDREC_DASH_WORKER_URLS": ",".join(workers) if opts.recommend else "",
            "FEDREC_DASH_HOST": opts.host,
            "FEDREC_DASH_PORT": str(opts.dashboard_port),
            "FEDREC_DASH_LOG_LEVEL": opts.aggregator_log_level,
        }
        return self.start("dashboard", ["services.dashboard"], env)

    def worker_store(self, shard: int) -> Path:
        """The store file of worker ``shard``."""
        return self.opts.workdir / f"worker-{shard}.db"

    def worker_args(self, shard: int) -> list[str]:
        """``python -m`` arguments of worker ``shard``."""
        opts = self.opts
        args = [
            "services.client_sim",
            "--aggregator",
            self.agg_url,
            "--shard",
            str(shard),
            "--shards",
            str(opts.workers),
            *_data_args(opts),
            "--store",
            str(self.worker_store(shard)),
            "--validation" if opts.validation else "--no-validation",
            "--log-level",
            opts.worker_log_level,
        ]
        if opts.worker_poll_max_s is not None:
            args += ["--poll-max-s", str(opts.worker_poll_max_s)]
        if opts.redis_url:
            args += ["--redis-url", opts.redis_url]
        if opts.recommend:
            args += [
                "--http-port",
                str(opts.worker_http_port + shard),
                "--recommend-url",
                self.rec_url,
                # keep serving the demo HTTP API after the run; the launcher stops them
                "--no-exit-when-finished",
            ]
        return args

    def start_worker(self, shard: int) -> Proc:
        """Start worker ``shard`` (again, after a crash: the same store)."""
        env = {
            "FEDREC_WORKER_TORCH_THREADS": str(worker_torch_threads(self.opts.workers)),
            "FEDREC_WORKER_ENROLMENT_TOKEN": self.enrolment_token(shard),
        }
        return self.start(f"worker-{shard}", self.worker_args(shard), env)

    def write_operator_token(self) -> Path:
        """Write the operator token to ``workdir/operator.token`` (mode 0600); its path."""
        path = self.opts.workdir / TOKEN_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(self.operator_token + "\n")
        return path

    def operator_headers(self) -> dict[str, str]:
        """Authorization header with the operator token."""
        return {"Authorization": f"Bearer {self.operator_token}"}

    def wait_registered(self, n_users: int) -> None:
        """Wait until ``n_users`` clients are registered."""
        deadline = time.monotonic() + self.opts.startup_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            self.check_workers()
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{self.agg_url}/v1/clients/count", timeout=2.0)
                if r.status_code == 200 and r.json()["registered"] >= n_users:
                    return
            time.sleep(0.3)
        raise LaunchError(
            f"the workers did not register every user in time; see {self.opts.workdir}/worker-*.log"
        )

    def start_run(self, n_items: int) -> dict[str, Any]:
        """Start the training run (operator API); returns the answer of ``POST /v1/runs``.
        With :meth:`restart_dead_services`, an aggregator that dies meanwhile is waited for
        and asked again (a run it stored before dying answers 409 ``run_active``: ``{}``)."""
        asked_before = False
        while True:
            try:
                resp = httpx.post(
                    f"{self.agg_url}/v1/runs",
                    json=run_config(self.opts, n_items),
                    headers=self.operator_headers(),
                    timeout=30,
                )
            except httpx.TransportError:
                if self.restarts is None:
                    raise
                self.wait_healthy(f"{self.agg_url}/healthz", "aggregator")
                asked_before = True
                continue
            if asked_before and resp.status_code == 409 and "run_active" in resp.text:
                return {}
            if resp.status_code != 201:
                raise LaunchError(f"starting the run failed: {resp.status_code} {resp.text}")
            body: dict[str, Any] = resp.json()
            return body

    def latest(self, name: str) -> Proc:
        """The most recently started process called ``name``."""
        for p in reversed(self.procs):
            if p.name == name:
                return p
        raise KeyError(name)

    def check_workers(self) -> None:
        """Raise if the current process of a worker exited with an error (naming its log); with
        :meth:`restart_dead_services`, restart it instead (:meth:`check_alive`)."""
        if self.restarts is not None:
            self.check_alive()
            return
        for name in {p.name for p in self.procs if p.name.startswith("worker")}:
            p = self.latest(name)
            code = p.popen.poll()
            if code not in (None, 0):
                raise p.exited(code)

    def wait_complete(self, timeout_s: float, poll_s: float = 0.2) -> dict[str, Any]:
        """Wait, without a display, until every round of the run is closed and evaluated;
        returns the history. Raises LaunchError when a process fails or on timeout."""
        deadline = time.monotonic() + timeout_s
        history: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self.check_alive()
            self.check_workers()
            with contextlib.suppress(httpx.HTTPError):
                history = self.history()
                if run_complete(history, self.opts.run):
                    return history
            time.sleep(poll_s)
        done = len(history.get("rounds", []))
        raise LaunchError(f"the run did not complete in {timeout_s:.0f}s (rounds closed: {done})")

    def history(self) -> dict[str, Any]:
        """The whole history of the run (``GET /v1/runs/current/history``, read a page at a
        time into the copy this launcher holds: only what changed since the last call)."""

        def page(after: int) -> dict[str, Any]:
            url = f"{self.agg_url}/v1/runs/current/history"
            resp = httpx.get(url, params={"after": after}, timeout=10)
            resp.raise_for_status()
            body: dict[str, Any] = resp.json()
            return body

        self._history.refresh(page)
        return self._history.body()


def run_complete(history: dict[str, Any], run: RunParams) -> bool:
    """Whether ``history`` has the run's closed rounds (fewer when the run plans fewer: a
    target epsilon stops it), each the run evaluates (``eval_every``, the last) with its
    global metrics."""
    rounds = min(run.rounds, history.get("planned_rounds") or run.rounds)
    closed = history.get("rounds", [])[:rounds]
    due = [r for r in closed if run.evaluates(r["round_id"], rounds)]
    return len(closed) >= rounds and all(r.get("metrics") for r in due)


def worker_torch_threads(workers: int) -> int:
    """Torch threads per worker when ``workers`` share this machine: its cores, split."""
    return max(1, min(MAX_THREADS, (os.cpu_count() or 1) // workers))


@contextlib.contextmanager
def cluster(opts: UpOptions) -> Iterator[Cluster]:
    """A started set of processes, stopped when the block ends (also on Ctrl-C)."""
    c = Cluster(opts)
    try:
        yield c
    finally:
        c.stop()


def _data_args(opts: UpOptions) -> list[str]:
    args = ["--dataset", opts.dataset]
    if opts.data_dir is not None:
        args += ["--data-dir", str(opts.data_dir)]
    return args


def run_config(opts: UpOptions, n_items: int) -> dict[str, Any]:
    """The RunConfig body for ``POST /v1/runs``: the run's settings over ``n_items``."""
    return RunConfig(n_items=n_items, **opts.run.model_dump()).model_dump(mode="json")
