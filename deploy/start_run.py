"""One-shot operator: wait for the aggregator and the workers, start a run, optionally follow it.

``POST /v1/runs`` with the operator token (docs/API.md). Configured by the environment:

* ``FEDREC_AGG_OPERATOR_TOKEN`` or ``FEDREC_AGG_OPERATOR_TOKEN_FILE`` (one is required);
* ``AGGREGATOR_URL`` (default ``http://aggregator:8700``);
* ``RUN_CONFIG``: a JSON object of RunConfig fields (default ``{"rounds": 100}``);
  ``RUN_ROUNDS``, ``RUN_DATASET``, ``RUN_QUORUM`` and ``RUN_DEADLINE_S``, when set, override
  its ``rounds``, ``dataset``, ``quorum`` and ``deadline_s``;
  ``n_items`` is taken from the dataset (default filmtrust) when it is not given;
* ``RUN_PRESET`` (default ``default``): the settings ``RUN_CONFIG`` leaves out are this
  preset's, as ``fedrec up --preset`` takes them (a clip norm fixed), but for the rounds
  (``RUN_ROUNDS``, else 100); ``paper`` gives the paper's settings;
* ``WAIT_FOR``: comma-separated worker ``/healthz`` URLs that must report ``registered`` first
  (the first round's cohort is drawn from the clients registered when the run starts);
* ``WAIT_TIMEOUT_S`` (default 600);
* ``DASHBOARD_PORT``: when set, the web dashboard's address on the host is printed first.

With ``--follow`` (the compose demo) it then prints a line per round (updates in, loss, HR@10)
until every round is closed and those the run evaluates (``eval_every``) are evaluated (or, once
the last round closed, for at most ``FEDREC_DEMO_EVAL_WAIT_S``, default 120 s, naming the rounds
still unevaluated: each evaluation waits for every registered client's report, which a worker that
never comes back does not send), then the last evaluated round's HR@10 beside a popularity count's;
when a round's uploads stop coming while some of its cohort has not uploaded, which shards those
clients belong to (``missing_by_shard`` of ``GET /v1/rounds/{id}``, shard ``i`` named by the
``i``-th of ``WORKER_URLS``) and what the deadline will do; and when a round closed without some
shard's clients or after a retry, that from then on the model differs from an undisturbed run's. At
the end it waits until recommend-api (``RECOMMEND_URL``) serves the final model, and prints the
top-10 of the first ``SHOW_USERS`` users (default 3), asked from their workers (``WORKER_URLS``,
comma-separated, user ``u`` on worker ``u % n``; bearer token of their device API in
``WORKER_TOKEN_FILE``) as their devices would.

Exit status 0 when the run started (and, with ``--follow``, finished) or one is already active
(which is then followed), 1 otherwise. The same request by hand::

    curl -X POST http://127.0.0.1:8700/v1/runs -H "Authorization: Bearer $FEDREC_AGG_OPERATOR_TOKEN" \\
         -H 'Content-Type: application/json' -d '{"n_items": 2059, "rounds": 100}'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any


class DemoError(RuntimeError):
    """The run could not be started or followed; the message says why."""


def _request(
    url: str, token: str | None = None, data: Any = None, timeout_s: float = 10.0
) -> tuple[int, Any]:
    """Status and JSON body of a GET (or a POST of ``data``); status 0 when nothing answered."""
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"null")
        except ValueError:
            return err.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


def wait_until(what: str, ready: Any, timeout_s: float, every_s: float = 1.0) -> None:
    """Poll ``ready()`` until it is true; DemoError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {what}")
        time.sleep(every_s)
    say(f"ready: {what}")


def say(line: str) -> None:
    """One log line (docker logs shows it as it comes)."""
    print(line, flush=True)


def secret(variable: str, required: bool = True) -> str:
    """``$variable``, or the content of the file ``$<variable>_FILE`` names."""
    token = os.environ.get(variable, "").strip()
    path = os.environ.get(f"{variable}_FILE", "").strip()
    if not token and path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as err:
            raise DemoError(f"cannot read {variable}_FILE {path}: {err}") from None
    if not token and required:
        raise DemoError(f"set {variable} or {variable}_FILE")
    return token


def operator_token() -> str:
    """The operator token from the environment or the file it names."""
    return secret("FEDREC_AGG_OPERATOR_TOKEN")


def _number(variable: str, low: float, high: float) -> float | None:
    """``$variable`` as a number in ``[low, high]``; None when unset; DemoError otherwise."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails too
        raise DemoError(f"{variable} must be a number from {low:g} to {high:g}, got {raw!r}")
    return value


def run_config() -> dict[str, Any]:
    """The RunConfig to post: ``$RUN_CONFIG`` with overrides and ``n_items`` filled in."""
    try:
        cfg = json.loads(os.environ.get("RUN_CONFIG") or '{"rounds": 100}')
    except ValueError as err:
        raise DemoError(f"RUN_CONFIG is not JSON ({err}): {os.environ['RUN_CONFIG']}") from None
    if not isinstance(cfg, dict):
        raise DemoError("RUN_CONFIG must be a JSON object")
    rounds = os.environ.get("RUN_ROUNDS", "").strip()
    if rounds:
        if not rounds.isdigit() or int(rounds) < 1:
            raise DemoError(f"RUN_ROUNDS must be a positive integer, got {rounds!r}")
        cfg["rounds"] = int(rounds)
    dataset = os.environ.get("RUN_DATASET", "").strip()
    if dataset:
        cfg["dataset"] = dataset
    quorum = _number("RUN_QUORUM", 0.0, 1.0)
    if quorum is not None:
        cfg["quorum"] = quorum
    deadline_s = _number("RUN_DEADLINE_S", 1.0, 7 * 86400.0)
    if deadline_s is not None:
        cfg["deadline_s"] = deadline_s
    cfg.setdefault("rounds", 100)
    preset = os.environ.get("RUN_PRESET", "").strip() or "default"
    from fedrecgel.presets import PresetError, over_http, run_settings

    try:  # a clip norm the aggregator keeps fixed, as fedrec up takes it
        settings = over_http(run_settings(preset, str(cfg.get("dataset", "filmtrust"))))
    except PresetError as err:
        raise DemoError(f"RUN_PRESET: {err}") from None
    for key, value in settings.items():
        if key != "rounds":
            cfg.setdefault(key, value)
    if "n_items" not in cfg:
        from fedrecgel.data import load_split

        name = str(cfg.get("dataset", "filmtrust"))
        try:
            cfg["n_items"] = int(load_split(name).n_items)
        except (OSError, ValueError, KeyError) as err:
            raise DemoError(f"cannot load dataset {name!r}: {err}") from None
    return cfg


def start_run(base_url: str, token: str, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """POST the run; its description when it started, None when one is already active."""
    status, body = _request(f"{base_url}/v1/runs", token, cfg, timeout_s=60)
    if status == 201:
        say(
            f"run {body['run_id']} started: {cfg['rounds']} rounds of {cfg.get('dataset')}, "
            f"{body['cohort_size']} clients a round"
        )
        return dict(body)
    if status == 409 and isinstance(body, dict) and body.get("error") == "run_active":
        say("a run is already active: following it")
        return None
    raise DemoError(f"POST /v1/runs -> {status}: {json.dumps(body)}")


def _hr(metrics: dict[str, float] | None) -> str:
    if not metrics or "hr@10" not in metrics:
        return ""
    return f"HR@10 {metrics['hr@10']:.4f}  NDCG@10 {metrics.get('ndcg@10', 0.0):.4f}"


def compare_with_popularity(dataset: str, history: dict[str, Any]) -> None:
    """Print the last evaluated round's HR@10 beside popularity's on the same test candidates
    (the workers' split: by default a validation item held out), the reference to beat."""
    from fedrecgel.baselines import popularity
    from fedrecgel.data import load_split
    from services.client_sim.settings import WorkerSettings

    held_out = bool(WorkerSettings.model_fields["validation"].default)
    try:
        pop = popularity(load_split(dataset, validation=held_out)).rounds[0].test
    except (OSError, ValueError, KeyError) as err:
        return say(f"popularity on {dataset}: not computed ({err})")
    done = [r for r in history.get("rounds", []) if (r.get("metrics") or {}).get("hr@10")]
    last = "no round evaluated"
    if done:
        last = f"round {done[-1]['round_id']} {_hr(done[-1]['metrics'])}"
    say(f"{last}; popularity (each item's count of users) on the same candidates: {_hr(pop)}")


#: seconds without a new upload to an open round (after its first) before the demo names the
#: shards whose clients have not uploaded
QUIET_S = 15.0
#: seconds the demo waits, once every round closed, for evaluations still missing (each needs
#: the report of every registered client: a worker that never comes back holds it forever)
EVAL_WAIT_S = float(os.environ.get("FEDREC_DEMO_EVAL_WAIT_S", "120"))


def shard_name(label: str, workers: list[str]) -> str:
    """A shard as ``missing_by_shard`` labels it (``"1/2"``), named for the reader, with its
    worker's URL when ``workers`` (in shard order) has one per shard."""
    if label == "none":
        return "clients registered without a shard credential"
    url = _worker_of(label, workers)
    index, _, count = label.partition("/")
    name = f"shard {index} of {count}" if count else f"shard {label}"
    return f"{name} ({url})" if url else name


def _worker_of(label: str, workers: list[str]) -> str | None:
    index, _, count = label.partition("/")
    ok = index.isdigit() and count.isdigit() and int(count) == len(workers)
    return workers[int(index)] if ok and int(index) < len(workers) else None


def missing_line(
    total: int,
    info: dict[str, Any],
    quorum: float,
    workers: list[str],
    answering: Any = None,
) -> str:
    """What the demo says of an open round whose uploads stopped coming: whose clients have not
    uploaded (by shard, each worker answering or not), and what the deadline will do."""
    answering = answering or (lambda url: _request(f"{url}/healthz", timeout_s=2.0)[0] == 200)
    n, m = int(info["updates_received"]), int(info["cohort_size"])
    parts = []
    for label, count in info["missing_by_shard"].items():
        url = _worker_of(label, workers)
        state = "" if url is None else (": answers" if answering(url) else ": does not answer")
        parts.append(f"{shard_name(label, workers)}{state}, {count} clients")
    need = max(1, math.ceil(quorum * m - 1e-9))
    at = str(info.get("deadline") or "")[11:19] or "?"
    then = (
        "closes without them"
        if n >= need
        else f"is retried with a new cohort unless {need - n} more come"
    )
    return (
        f"round {int(info['round_id']):>3}/{total}: {n}/{m} updates, none for {QUIET_S:.0f} s; "
        f"not uploaded: {'; '.join(parts)}. At its deadline ({at} UTC) the round {then} "
        f"(quorum {quorum:g}: {need} of {m})"
    )


def closed_note(info: dict[str, Any], workers: list[str]) -> str:
    """For a closed round that did not take every update of its first attempt's cohort: what
    it closed without; empty for a round an undisturbed run would have closed the same."""
    notes = []
    if int(info.get("attempt") or 0) > 0:
        notes.append(
            f"closed at attempt {int(info['attempt']) + 1} (retried below quorum, a new cohort)"
        )
    missing = info.get("missing_by_shard") or {}
    if missing:
        without = ", ".join(f"{shard_name(k, workers)}: {v}" for k, v in missing.items())
        notes.append(f"closed without the uploads of {without}")
    if not notes:
        return ""
    return "; ".join(notes) + ": from this round on the model differs from an undisturbed run's"


def follow(  # noqa: C901  # one polling loop: history, open round and state, each optional
    base: str,
    token: str,
    poll_s: float = 1.0,
    workers: list[str] | None = None,
    eval_wait_s: float = EVAL_WAIT_S,
) -> dict[str, Any]:
    """Print progress until every round of the current run is closed and evaluated, or until
    ``eval_wait_s`` after the last round closed with evaluations still missing; returns
    ``{"run_id", "rounds", "history", "first_round_s", "seconds", "unevaluated"}`` (the rounds
    left without metrics). ``workers``: the workers' URLs in shard order, to name the shards
    whose clients do not upload.

    Two requests a poll (the history, the open round's count), the run's state every tenth:
    the demo shares the machine with the run it shows."""
    workers = workers or []
    from fedrecgel.config import DEFAULTS, RunParams
    from services.history import HistoryCopy

    t0 = time.monotonic()
    status, cur = _request(f"{base}/v1/rounds/current", token)
    if status != 200 or not isinstance(cur, dict) or cur.get("config") is None:
        raise DemoError(f"no run to follow (GET /v1/rounds/current -> {status})")
    copy = HistoryCopy()  # the history read a page at a time: only what changed, each poll

    def page(after: int) -> dict[str, Any] | None:
        status, body = _request(f"{base}/v1/runs/current/history?after={after}")
        return body if status == 200 and isinstance(body, dict) else None

    def read_history() -> tuple[int, Any]:
        return (200, copy.body()) if copy.refresh(page) else (0, None)

    run_id, total = cur["run_id"], int(cur["config"]["rounds"])
    # which rounds the run evaluates
    cfg = RunParams(eval_every=int(cur["config"].get("eval_every", DEFAULTS.eval_every)))
    quorum = float(cur["config"].get("quorum", 1.0))
    # the open round's (round, attempt, updates) and since when; the missing shards last told
    progress: tuple[int, int, int] | None = None
    progress_since = time.monotonic()
    told: tuple[int, int, str] | None = None
    printed: set[int] = set()
    noted: set[int] = set()  # closed rounds whose closing was looked at (closed_note)
    shown: tuple[int, int] | None = None
    last_show = 0.0
    first_round_s: float | None = None
    all_closed_at: float | None = None
    polls = 0
    while True:
        polls += 1
        status, hist = read_history()
        if status == 200 and isinstance(hist, dict) and hist.get("run_id") not in (None, run_id):
            raise DemoError(f"run {run_id} was replaced by run {hist['run_id']}")
        rounds = hist.get("rounds", []) if status == 200 and isinstance(hist, dict) else []
        if rounds and first_round_s is None:
            first_round_s = time.monotonic() - t0
        for r in rounds:
            rid = int(r["round_id"])
            if rid not in noted:  # told at once: its metrics may wait for a missing worker
                noted.add(rid)
                status, info = _request(f"{base}/v1/rounds/{rid}")
                ok = status == 200 and isinstance(info, dict)
                note = closed_note(info, workers) if ok else ""
                if note:
                    say(f"round {rid:>3}/{total}: {note}")
            # a round is shown with its evaluation, or without once two later rounds closed
            # (at once when the run does not evaluate it: eval_every)
            due = cfg.evaluates(rid, total)
            ready = bool(r.get("metrics")) or not due or (rid < total and len(rounds) - rid >= 2)
            if rid in printed or not ready:
                continue
            printed.add(rid)
            figures = _hr(r.get("metrics")) or ("not evaluated yet" if due else "")
            say(
                f"round {rid:>3}/{total} closed: {r['n_updates']} updates, "
                f"loss {r['loss'] if r['loss'] is not None else float('nan'):.4f}"
                f"{', ' + figures if figures else ''}  ({r['seconds']:.1f} s)"
            )

        if len(rounds) >= total:
            all_closed_at = all_closed_at or time.monotonic()
            unevaluated = [
                int(r["round_id"])
                for r in rounds[:total]
                if not r.get("metrics") and cfg.evaluates(int(r["round_id"]), total)
            ]
            if not unevaluated or time.monotonic() - all_closed_at >= eval_wait_s:
                return {
                    "run_id": run_id,
                    "rounds": total,
                    "history": hist,
                    "first_round_s": first_round_s,
                    "seconds": time.monotonic() - t0,
                    "unevaluated": unevaluated,
                }
        nxt = len(rounds) + 1
        if nxt <= total:
            status, info = _request(f"{base}/v1/rounds/{nxt}")
            if status == 200 and isinstance(info, dict):
                now = (int(info["updates_received"]), int(info["cohort_size"]))
                if now != shown and time.monotonic() - last_show >= 2.0:
                    say(f"round {nxt:>3}/{total}: {now[0]}/{now[1]} updates in")
                    shown, last_show = now, time.monotonic()
                key = (nxt, int(info.get("attempt") or 0), now[0])
                if key != progress:
                    progress, progress_since = key, time.monotonic()
                missing = info.get("missing_by_shard") or {}
                quiet = time.monotonic() - progress_since >= QUIET_S
                what = (key[0], key[1], json.dumps(missing, sort_keys=True))
                if info.get("state") == "open" and missing and now[0] and quiet and what != told:
                    say(missing_line(total, info, quorum, workers))
                    told = what
        status, cur = _request(f"{base}/v1/rounds/current", token) if polls % 10 == 0 else (0, None)
        if status == 200 and isinstance(cur, dict):
            if cur.get("run_id") != run_id:
                raise DemoError(f"run {run_id} was replaced by run {cur.get('run_id')}")
            if cur.get("state") in ("finished", "idle"):
                # read the history again: the last round may have closed since
                _, again = read_history()
                closed = len(again.get("rounds", [])) if isinstance(again, dict) else 0
                if closed < total:
                    raise DemoError(f"run {run_id} ended after {closed} of {total} rounds")
        time.sleep(poll_s)


def show_recommendations(
    rec_url: str,
    worker_urls: list[str],
    version: int,
    users: int,
    timeout_s: float,
    worker_token: str = "",
) -> bool:
    """Wait until recommend-api serves ``version``, then print the first users' top-10 as their
    workers answer them; True when every user got an answer."""

    def serving() -> bool:
        status, body = _request(f"{rec_url}/healthz", timeout_s=5.0)
        return (
            status == 200 and isinstance(body, dict) and (body.get("model_version") or 0) >= version
        )

    wait_until(f"recommend-api serving model v{version}", serving, timeout_s, every_s=0.5)
    columns: dict[int, list[str]] = {}
    ok = True
    for user in range(users):
        url = f"{worker_urls[user % len(worker_urls)]}/v1/users/{user}/recommendations?k=10"
        status, body = _request(url, worker_token or None, timeout_s=30)
        if status != 200 or not isinstance(body, dict):
            say(f"user {user}: {url} -> {status} {json.dumps(body)}")
            ok = False
            continue
        columns[user] = [f"{it['item']} ({it['score']:+.2f})" for it in body["items"]]
        version = int(body["model_version"])
    if columns:
        width = max(len(x) for col in columns.values() for x in col) + 2
        say(f"top-10 recommendations, model v{version} (item id (logit)), asked via the workers:")
        say("rank  " + "".join(f"user {u}".ljust(width) for u in columns))
        for rank in range(10):
            cells = [col[rank] if rank < len(col) else "" for col in columns.values()]
            say(f"{rank + 1:>4}  " + "".join(c.ljust(width) for c in cells))
    return ok


def main(argv: list[str] | None = None) -> int:
    """Wait for the aggregator and the workers, start the run, follow it when asked."""
    parser = argparse.ArgumentParser(prog="start_run.py", description="start (and follow) a run")
    parser.add_argument("--follow", action="store_true", help="print progress until the end")
    args = parser.parse_args(argv)
    base = os.environ.get("AGGREGATOR_URL", "http://aggregator:8700").rstrip("/")
    if dashboard_port := os.environ.get("DASHBOARD_PORT", "").strip():
        say(f"dashboard: http://127.0.0.1:{dashboard_port}/ui/ (on the host)")
    try:
        timeout_s = float(os.environ.get("WAIT_TIMEOUT_S", "600"))
        token = operator_token()
        cfg = run_config()
        wait_until("aggregator", lambda: _request(f"{base}/healthz")[0] == 200, timeout_s)
        for url in filter(None, (u.strip() for u in os.environ.get("WAIT_FOR", "").split(","))):

            def registered(url: str = url) -> bool:
                status, body = _request(url, timeout_s=5.0)
                return status == 200 and isinstance(body, dict) and body.get("registered") is True

            wait_until(f"worker {url}", registered, timeout_s)
        start_run(base, token, cfg)
        if not args.follow:
            return 0
        workers = [u.strip().rstrip("/") for u in os.environ.get("WORKER_URLS", "").split(",")]
        workers = [u for u in workers if u]
        done = follow(base, token, workers=workers)
        missing = done["unevaluated"]
        say(
            f"run {done['run_id']}: {done['rounds']} rounds closed "
            f"{'and evaluated ' if not missing else ''}in {done['seconds']:.1f} s (first "
            f"round closed after {done['first_round_s']:.1f} s)"
        )
        if missing:
            say(
                f"rounds {', '.join(map(str, missing))} have no evaluation after "
                f"{EVAL_WAIT_S:.0f} s: an evaluation needs a report from every registered "
                "client, and a worker whose shard stopped uploading has not reported (start it "
                "again and the aggregator completes them; FEDREC_DEMO_EVAL_WAIT_S sets the wait)"
            )
        compare_with_popularity(str(cfg.get("dataset", "filmtrust")), done["history"])
        rec_url = os.environ.get("RECOMMEND_URL", "").rstrip("/")
        users = int(os.environ.get("SHOW_USERS", "3"))
        if workers and rec_url and users > 0:
            device = secret("WORKER_TOKEN", required=False)
            shown = show_recommendations(rec_url, workers, done["rounds"], users, timeout_s, device)
            return 0 if shown else 1
        return 0
    except DemoError as err:
        sys.stderr.write(f"{err}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
