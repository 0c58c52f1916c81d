"""Schema-driven fuzzing of the three services as real processes on loopback.

Starts ``python -m services.aggregator`` (SQLite, an enrolment secret, FilmTrust's population),
``python -m services.recommend_api`` (following the aggregator with the reader token) and one
worker ``python -m services.client_sim`` serving its device API (all of FilmTrust's users,
enrolled with the shard's token); trains a short run so that every service has its state (a
model, private vectors); then fuzzes each service's OpenAPI document with schemathesis
(``harness/fuzz.py``: valid and invalid requests per operation), with every credential
kind the service knows: recommend_api takes none; the device API is fuzzed without and with its
device token; the aggregator anonymously and with the worker's client token, the reader token,
the enrolment token and the operator token (last: it pauses, stops and starts runs). The aggregator runs under an
address-space limit, so an oversized model fails a request instead of the machine.

Writes ``bench/results/fuzz.json``: per service and credential kind, the requests tried, the
answers by status, the 5xx answers, the answers the document does not describe, the invalid
requests accepted, the requests without an answer (timeouts) and the findings (as curl).

    python -m bench.fuzz_services [--examples 50] [--seed 0] [--quick]
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx

from bench.aggregator_ingest import wait_healthy
from bench.bench_cli import OutFile, opt
from fedrecgel.data import load_split
from harness.fuzz import Tally, fuzz, load_schema
from harness.fuzz_targets import (
    AGGREGATOR_KINDS,
    AggregatorCredentials,
    bearer,
    fuzz_aggregator,
    pinned_schema,
)
from harness.loopback import free_port
from harness.procs import spawned
from services.client_sim.store import WorkerStore
from services.contract import RunConfig
from services.enrolment import enrolment_token
from services.recommend_api.settings import Settings as RecommendSettings

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "fuzz.json"
DATASET = "filmtrust"
OPERATOR_TOKEN = "bench-fuzz-operator-token-7c1d93e5a2f48b60"
READER_TOKEN = "bench-fuzz-reader-token-4e8a1f07c9d3b25e"
ENROLMENT_SECRET = "bench-fuzz-enrolment-secret-b3f9061d8e2a47c5"
DEVICE_TOKEN = "bench-fuzz-device-token-91e4c7a02f6d35b8"
# the short run that gives every service its state before the fuzzing
RUN: dict[str, Any] = {"rounds": 2, "fraction": 0.05, "seed": 0, "deadline_s": 600.0}
# what the aggregator process may map beyond what it maps once started
AGGREGATOR_HEADROOM_BYTES = 4 << 30


def limit_address_space(pid: int, headroom: int) -> int:
    """Cap the address space of process ``pid`` at what it maps now plus ``headroom``."""
    status = Path(f"/proc/{pid}/status").read_text()
    vm = next(int(line.split()[1]) * 1024 for line in status.splitlines() if "VmSize" in line)
    limit = vm + headroom
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    return limit


@contextlib.contextmanager
def services(work: Path, n_users: int) -> Iterator[dict[str, Any]]:
    """The three services started on free ports; their URLs, tokens and processes."""
    agg_port, rec_port, dev_port = free_port(), free_port(), free_port()
    agg = f"http://127.0.0.1:{agg_port}"
    rec = f"http://127.0.0.1:{rec_port}"
    enrol = enrolment_token(ENROLMENT_SECRET, 0, 1)
    base_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agg_env = {
        **base_env,
        "FEDREC_AGG_ENVIRONMENT": "production",
        "FEDREC_AGG_DATABASE_URL": f"sqlite:///{work / 'aggregator.db'}",
        "FEDREC_AGG_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "FEDREC_AGG_READER_TOKEN": READER_TOKEN,
        "FEDREC_AGG_ENROLMENT_SECRET": ENROLMENT_SECRET,
        "FEDREC_AGG_POPULATION": str(n_users),
        "FEDREC_AGG_PORT": str(agg_port),
        "FEDREC_AGG_LOG_LEVEL": "warning",
    }
    rec_env = {
        **base_env,
        "FEDREC_REC_AGGREGATOR_URL": agg,
        "FEDREC_REC_AGGREGATOR_TOKEN": READER_TOKEN,
        "FEDREC_REC_DATASET": DATASET,
        "FEDREC_REC_PORT": str(rec_port),
        "FEDREC_REC_POLL_INTERVAL_S": "0.5",
        "FEDREC_REC_WORKERS": "2",
    }
    store = work / "worker-0.db"
    worker_env = {
        **base_env,
        "FEDREC_WORKER_ENROLMENT_TOKEN": enrol,
        "FEDREC_WORKER_DEVICE_TOKEN": DEVICE_TOKEN,
    }
    worker_args = [
        *("--aggregator", agg, "--shard", "0", "--shards", "1", "--dataset", DATASET),
        *("--store", str(store), "--http-port", str(dev_port), "--recommend-url", rec),
        *("--no-exit-when-finished", "--torch-threads", "1", "--log-level", "WARNING"),
    ]
    py = sys.executable
    with (
        (work / "aggregator.log").open("ab") as agg_log,
        (work / "recommend_api.log").open("ab") as rec_log,
        (work / "worker.log").open("ab") as worker_log,
        spawned([py, "-m", "services.aggregator"], agg_log, grace_s=15, env=agg_env) as agg_p,
    ):
        wait_healthy(f"{agg}/healthz", timeout_s=120.0)
        limit = limit_address_space(agg_p.pid, AGGREGATOR_HEADROOM_BYTES)
        with (
            spawned([py, "-m", "services.recommend_api"], rec_log, grace_s=15, env=rec_env),
            spawned(
                [py, "-m", "services.client_sim", *worker_args],
                worker_log,
                grace_s=15,
                env=worker_env,
            ) as worker_p,
        ):
            yield {
                "aggregator": agg,
                "recommend_api": rec,
                "worker": f"http://127.0.0.1:{dev_port}",
                "enrolment": enrol,
                "store": store,
                "worker_process": worker_p,
                "aggregator_process": agg_p,
                "aggregator_address_space_limit": limit,
            }


def train(urls: dict[str, Any], n_users: int, n_items: int, timeout_s: float) -> dict[str, Any]:
    """Wait for the worker's registration, run :data:`RUN`, wait for the model and the
    worker's private states; the run's config."""
    agg = urls["aggregator"]
    deadline = time.monotonic() + timeout_s
    while True:
        if urls["worker_process"].poll() is not None:
            raise SystemExit("the worker exited before registering (see its log)")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{agg}/v1/clients/count", timeout=5)
            if r.status_code == 200 and r.json()["registered"] >= n_users:
                break
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not register its users in time")
        time.sleep(0.5)
    config = RunConfig(n_items=n_items, dataset=DATASET, **RUN).model_dump(mode="json")
    r = httpx.post(f"{agg}/v1/runs", json=config, headers=bearer(OPERATOR_TOKEN), timeout=120)
    if r.status_code != 201:
        raise SystemExit(f"starting the run: {r.status_code} {r.text}")
    while True:
        with contextlib.suppress(httpx.HTTPError):
            rounds = httpx.get(f"{agg}/v1/runs/current/history", timeout=5).json()["rounds"]
            if len(rounds) >= RUN["rounds"]:
                break
        if time.monotonic() > deadline:
            raise SystemExit("the run did not finish in time")
        time.sleep(1.0)
    wait_healthy(f"{urls['recommend_api']}/healthz", timeout_s=120.0)
    wait_healthy(f"{urls['worker']}/healthz", timeout_s=120.0)  # open without the token
    return config


def client_token(store: Path) -> str:
    """The client token the worker saved in its store."""
    token = WorkerStore(store).get_meta("token")
    if not token:
        raise SystemExit("the worker saved no client token")
    return str(token)


def main(
    examples: Annotated[int, opt("per operation and mode")] = 50,
    seed: int = int(time.time()) % 100_000,
    quick: Annotated[bool, opt("10 examples (a smoke run)")] = False,
    timeout_s: Annotated[float, opt("per request")] = 15.0,
    out: OutFile = OUT,
    keep: Annotated[bool, opt("keep the work directory (logs)")] = False,
) -> None:
    """Start, train, fuzz, write the JSON."""
    examples = 10 if quick else examples
    split = load_split(DATASET)
    started = time.monotonic()
    results: dict[str, dict[str, Tally]] = {}
    common: dict[str, Any] = {"max_examples": examples, "seed": seed, "timeout_s": timeout_s}
    with work_dir(keep) as tmp, services(tmp, split.n_users) as urls:
        config = train(urls, split.n_users, split.n_items, timeout_s=900)
        trained_s = time.monotonic() - started
        dims = RunConfig.model_validate(config).model().private_dims()
        labels = [str(x) for x in split.item_labels.tolist()]
        max_k = int(RecommendSettings.model_fields["max_k"].default)
        rec = urls["recommend_api"]
        print(f"trained in {trained_s:.0f}s; fuzzing recommend_api", flush=True)
        tally = fuzz(load_schema(rec), rec, service="recommend_api", token="anonymous", **common)
        tally.merge(
            fuzz(
                pinned_schema(rec, dims, labels, max_k),
                rec,
                service="recommend_api",
                token="anonymous",
                include=lambda label: label == "POST /v1/recommendations",
                **common,
            )
        )
        results["recommend_api"] = {"anonymous": tally}
        print("fuzzing the device API", flush=True)
        dev = urls["worker"]
        device = bearer(DEVICE_TOKEN)
        dev_schema = load_schema(dev, headers=device)
        results["worker"] = {
            kind: fuzz(dev_schema, dev, service="worker", token=kind, headers=h, **common)
            for kind, h in (("anonymous", None), ("device", device))
        }
        agg = urls["aggregator"]
        creds = AggregatorCredentials(
            OPERATOR_TOKEN, READER_TOKEN, urls["enrolment"], client_token(urls["store"])
        )
        schema = load_schema(agg)
        results["aggregator"] = {}
        # which processes still run after each credential's turn (a worker may exit when
        # what the fuzzer did leaves it no way on)
        alive: dict[str, dict[str, bool]] = {}
        for kind in AGGREGATOR_KINDS:
            print(f"fuzzing the aggregator, {kind}", flush=True)
            results["aggregator"][kind] = fuzz_aggregator(schema, agg, kind, creds, **common)
            alive[kind] = {
                "aggregator": urls["aggregator_process"].poll() is None,
                "worker": urls["worker_process"].poll() is None,
            }
        worker_log = _tail(tmp / "worker.log")
        if keep:
            print(f"logs kept in {tmp}")
        limit = urls["aggregator_address_space_limit"]
    result = {
        "dataset": DATASET,
        "examples_per_operation_and_mode": examples,
        "modes": ["positive", "negative"],
        "seed": seed,
        "request_timeout_s": timeout_s,
        "schemathesis": _version("schemathesis"),
        "hypothesis": _version("hypothesis"),
        "aggregator_address_space_limit_gb": round(limit / 2**30, 2),
        "alive_after_aggregator_fuzzing": alive,
        "worker_log_tail": worker_log,
        "wall_s": round(time.monotonic() - started, 1),
        "training_s": round(trained_s, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "services": {
            service: {kind: t.summary() for kind, t in kinds.items()}
            for service, kinds in results.items()
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for service, kinds in results.items():
        for kind, t in kinds.items():
            print(
                f"{service:14s} {kind:10s} requests {t.requests:6d}  5xx {t.server_errors}  "
                f"violations {t.violations}  accepted-invalid {t.invalid_accepted}  "
                f"no-answer {t.transport_errors}"
            )
            if not t.clean:
                print(t.report())
    print(f"wrote {out}")


@contextlib.contextmanager
def work_dir(keep: bool) -> Iterator[Path]:
    """A fresh directory for the databases and logs, removed at the end unless ``keep``."""
    path = Path(tempfile.mkdtemp(prefix="fedrec-fuzz-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def _tail(path: Path, lines: int = 15) -> list[str]:
    """The last lines of a log file."""
    if not path.exists():
        return []
    return path.read_text(errors="replace").splitlines()[-lines:]


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
