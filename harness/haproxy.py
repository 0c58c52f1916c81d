"""A throw-away haproxy on loopback in front of aggregator replicas (tests and benchmarks).

Round-robin over the replicas, each health-checked on its ``GET /healthz`` (200 while its
database answers; a replica that stops answering is taken out after two failed checks, half a
second apart, and put back after two good ones). A connection the chosen replica refuses is
tried again on another one (``option redispatch 1``); a request a replica died while answering
comes back as 502, which the workers retry. The stats page (``/stats;csv``) says which
replicas are up and how many requests each took.
"""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.loopback import free_port, stop_process, wait_for_port

#: why a test that needs haproxy is skipped on a machine without it
HAPROXY_MISSING = "haproxy is not installed (apt-get install -y haproxy)"
#: the backend's name in the configuration (and in the stats)
BACKEND = "aggregators"


class HaproxyUnavailable(RuntimeError):
    """haproxy is not installed, or did not start."""


def balancer_config(
    port: int, stats_port: int, servers: Mapping[str, int], health_path: str = "/healthz"
) -> str:
    """haproxy's configuration: ``port`` balanced over ``servers`` (name -> loopback port)."""
    lines = [
        "global",
        "    maxconn 1024",
        "defaults",
        "    mode http",
        "    option http-keep-alive",
        "    timeout connect 2s",
        "    timeout client 120s",
        "    timeout server 120s",
        "    timeout http-keep-alive 60s",
        "    timeout http-request 60s",
        "    retries 3",
        "    option redispatch 1",
        "frontend aggregator",
        f"    bind 127.0.0.1:{port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    balance roundrobin",
        f"    option httpchk GET {health_path}",
        "    http-check expect status 200",
        "    default-server inter 500ms fall 2 rise 2",
        *(f"    server {name} 127.0.0.1:{p} check" for name, p in servers.items()),
        "listen stats",
        f"    bind 127.0.0.1:{stats_port}",
        "    stats enable",
        "    stats uri /stats",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Balancer:
    """A running haproxy: its front port and stats page."""

    port: int
    stats_port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """Base URL of the balanced front."""
        return f"http://127.0.0.1:{self.port}"

    def servers(self) -> dict[str, dict[str, str]]:
        """The backend's servers as the stats page shows them: name -> stats row (``status``
        ``UP``/``DOWN``/..., ``stot`` sessions, ``hrsp_5xx`` 5xx answers, ...)."""
        r = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5)
        r.raise_for_status()
        rows = csv.DictReader(io.StringIO(r.text.lstrip("# ")))
        return {
            row["svname"]: row
            for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_status(self, server: str, status: str, timeout_s: float = 30.0) -> None:
        """Wait until the stats show ``server`` with ``status`` (``UP``, ``DOWN``)."""
        deadline = time.monotonic() + timeout_s
        seen = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HaproxyUnavailable(f"haproxy exited with {self.process.returncode}")
            seen = self.servers()[server]["status"]
            if seen.split()[0] == status:
                return
            time.sleep(0.1)
        raise AssertionError(f"haproxy: {server} is {seen!r}, not {status!r}, after {timeout_s}s")


@contextlib.contextmanager
def balancer(
    workdir: Path, servers: Mapping[str, int], port: int | None = None
) -> Iterator[Balancer]:
    """haproxy on loopback ``port`` (else a free one) in front of ``servers`` (name -> port),
    in the foreground, its configuration and log in ``workdir``; stopped at the end."""
    binary = shutil.which("haproxy")
    if binary is None:
        raise HaproxyUnavailable(HAPROXY_MISSING)
    port = free_port() if port is None else port
    stats_port = free_port()
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(balancer_config(port, stats_port, servers))
    check = subprocess.run([binary, "-c", "-q", "-f", str(cfg)], capture_output=True, timeout=30)
    if check.returncode != 0:
        raise HaproxyUnavailable(f"haproxy refuses {cfg}: {check.stderr.decode()[-500:]}")
    with (workdir / "haproxy.log").open("ab") as log:
        proc = subprocess.Popen(
            [binary, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        if not (wait_for_port(port) and wait_for_port(stats_port)):
            raise HaproxyUnavailable(f"haproxy did not listen on {port} (see {workdir})")
        yield Balancer(port, stats_port, proc)
    finally:
        stop_process(proc)
