"""One-shot operator: wait for the aggregator and the workers, then start a run.

``POST /v1/runs`` with the operator token (docs/API.md). Configured by the environment:

* ``FEDREC_AGG_OPERATOR_TOKEN`` (required): the aggregator's operator token;
* ``AGGREGATOR_URL`` (default ``http://aggregator:8700``);
* ``RUN_CONFIG``: a JSON object of RunConfig fields (default ``{"rounds": 100}``); ``n_items``
  is taken from the dataset (``dataset``, default filmtrust) when it is not given;
* ``WAIT_FOR``: comma-separated worker ``/healthz`` URLs that must report ``registered`` first
  (the first round's cohort is drawn from the clients registered when the run starts);
* ``WAIT_TIMEOUT_S`` (default 600).

Exit status 0 when the run started or one is already active (so re-running it is harmless),
1 otherwise. The same request by hand::

    curl -X POST http://127.0.0.1:8700/v1/runs -H "Authorization: Bearer $FEDREC_AGG_OPERATOR_TOKEN" \\
         -H 'Content-Type: application/json' -d '{"n_items": 2059, "rounds": 100}'
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def _get_json(url: str, timeout_s: float = 5.0) -> tuple[int, Any]:
    """Status and JSON body of ``GET url`` (status 0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


def wait_until(what: str, ready: Any, timeout_s: float, every_s: float = 2.0) -> None:
    """Poll ``ready()`` until it is true; SystemExit(1) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            sys.stderr.write(f"timed out waiting for {what}\n")
            raise SystemExit(1)
        time.sleep(every_s)
    print(f"ready: {what}", flush=True)


def run_config() -> dict[str, Any]:
    """The RunConfig to post: ``$RUN_CONFIG`` with ``n_items`` filled in from the dataset."""
    cfg: dict[str, Any] = json.loads(os.environ.get("RUN_CONFIG") or '{"rounds": 100}')
    if not isinstance(cfg, dict):
        raise SystemExit("RUN_CONFIG must be a JSON object")
    cfg.setdefault("rounds", 100)
    if "n_items" not in cfg:
        from fedrecgel.data import load_split

        cfg["n_items"] = int(load_split(str(cfg.get("dataset", "filmtrust"))).n_items)
    return cfg


def start_run(base_url: str, token: str, cfg: dict[str, Any]) -> int:
    """POST the run; 0 when it started (201) or one is already active (409 run_active)."""
    req = urllib.request.Request(
        f"{base_url.rstrip('/')}/v1/runs",
        data=json.dumps(cfg).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            print(f"run started: {resp.read().decode()}", flush=True)
            return 0
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")
        if err.code == 409 and '"run_active"' in body:
            print(f"a run is already active: {body}", flush=True)
            return 0
        sys.stderr.write(f"POST /v1/runs -> {err.code}: {body}\n")
        return 1


def main() -> int:
    """Wait for the aggregator and the workers, then start the run."""
    token = os.environ.get("FEDREC_AGG_OPERATOR_TOKEN", "")
    if not token:
        sys.stderr.write("FEDREC_AGG_OPERATOR_TOKEN is not set\n")
        return 1
    base = os.environ.get("AGGREGATOR_URL", "http://aggregator:8700")
    timeout_s = float(os.environ.get("WAIT_TIMEOUT_S", "600"))
    cfg = run_config()
    wait_until("aggregator", lambda: _get_json(f"{base}/healthz")[0] == 200, timeout_s)
    for url in filter(None, (u.strip() for u in os.environ.get("WAIT_FOR", "").split(","))):

        def registered(url: str = url) -> bool:
            status, body = _get_json(url)
            return status == 200 and isinstance(body, dict) and body.get("registered") is True

        wait_until(f"worker {url}", registered, timeout_s)
    return start_run(base, token, cfg)


if __name__ == "__main__":
    sys.exit(main())
