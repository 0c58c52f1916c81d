"""Aggregator replicas behind haproxy on loopback: N ``fedrec aggregator`` processes, each on
its own port, over one database (and one Redis), and the balancer in front of them, whose
address the workers and every helper of :class:`~services.launcher.Cluster` use. Used by
``tests/e2e/test_aggregator_replicas.py`` and ``bench/aggregator_replicas.py``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from harness.haproxy import Balancer, balancer
from harness.loopback import free_port
from harness.procs import FEDREC_MODULE
from services.launcher import Cluster, UpOptions
from services.restarts import Proc

#: a replica's log line for a round it closed (``services/aggregator/rounds.py``)
_CLOSED = re.compile(r"round (\d+) closed: \d+/\d+ updates -> version (\d+)")


class Replicas(Cluster):
    """A :class:`Cluster` whose aggregator is several replicas behind a balancer:
    ``agg_url`` (``opts.aggregator_port``) is the balancer's front, each replica listens on
    its own port of ``ports`` (name -> port). A replica killed on purpose (:meth:`kill`) is
    not an error for :meth:`check_alive`."""

    def __init__(self, opts: UpOptions, ports: dict[str, int]) -> None:
        super().__init__(opts)
        self.ports = ports
        self._killed: list[Proc] = []

    def replica_url(self, name: str) -> str:
        """The base URL of one replica (not through the balancer)."""
        return f"http://{self.opts.host}:{self.ports[name]}"

    def start_replica(self, name: str, wait: bool = True) -> Proc:
        """Start (or start again) the replica ``name``: ``fedrec aggregator --port P`` with
        the cluster's settings (the same database, Redis and tokens for all)."""
        args = [FEDREC_MODULE, "aggregator", "--port", str(self.ports[name])]
        proc = self.start(name, args, self.aggregator_env())
        if wait:
            self.wait_healthy(f"{self.replica_url(name)}/healthz", name)
        return proc

    def kill(self, name: str) -> int:
        """SIGKILL the replica ``name``; its exit status."""
        proc = self.latest(name)
        self._killed.append(proc)
        return proc.kill()

    def check_alive(self) -> None:
        """:meth:`Cluster.check_alive`, but for the replicas killed on purpose."""
        for name in dict.fromkeys(p.name for p in self.procs):
            p = self.latest(name)
            code = p.popen.poll()
            if code is not None and not name.startswith("worker") and p not in self._killed:
                raise p.exited(code)

    def closes(self) -> list[tuple[str, int, int]]:
        """Every round close the replicas logged: (replica, round, version), in log order
        per replica (a replica started again appends to its log)."""
        out = []
        for name in self.ports:
            path: Path = self.opts.workdir / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            out += [(name, int(r), int(v)) for r, v in _CLOSED.findall(text)]
        return out


@contextlib.contextmanager
def replicas_behind_balancer(opts: UpOptions, n: int) -> Iterator[tuple[Replicas, Balancer]]:
    """``n`` aggregator replicas (``aggregator-0`` ...) started together (their schema
    migrations race on one database) behind haproxy on ``opts.aggregator_port``, each healthy
    and up in the balancer; all stopped at the end."""
    opts.workdir.mkdir(parents=True, exist_ok=True)
    ports = {f"aggregator-{i}": free_port() for i in range(n)}
    with balancer(opts.workdir, ports, port=opts.aggregator_port) as lb:
        c = Replicas(opts, ports)
        try:
            for name in ports:
                c.start_replica(name, wait=False)
            for name in ports:
                c.wait_healthy(f"{c.replica_url(name)}/healthz", name)
                lb.wait_status(name, "UP")
            yield c, lb
        finally:
            c.stop()
