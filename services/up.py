"""``fedrec up`` itself: start the local deployment (:mod:`services.launcher`), train, show the
progress and the users' recommendations, and stop everything at the end or on a stop signal."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from fedrecgel.data import Split

from services.launcher import Cluster, UpOptions, check_ports, cluster, console, run_complete
from services.supervise import (
    LOCK_FILE,
    LaunchError,
    Stopped,
    check_workdir,
    clear_workdir,
    locked_workdir,
    stop_on_signals,
)


def check_redis(url: str | None) -> None:
    """Raise LaunchError when ``url`` (``--redis-url``) is not a Redis URL or no Redis
    answers there: every service would otherwise start and fail on it, one by one."""
    if url is None:
        return
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3.0, socket_timeout=3.0)
    except ValueError as err:
        raise LaunchError(f"--redis-url is not a Redis URL: {err}") from None
    try:
        client.ping()
    except redis.RedisError as err:
        raise LaunchError(f"--redis-url: Redis does not answer: {err}") from None
    finally:
        client.close()


def check_database(url: str | None) -> None:
    """Raise LaunchError when ``url`` (``--database-url``) is not a database URL with its driver
    here, or no database answers there: the aggregator would otherwise die on it at start, and
    again at each restart."""
    if url is None:
        return
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from services.url_settings import check_database_url

    try:
        check_database_url(url)
    except ValueError as err:
        raise LaunchError(f"--database-url: {err}") from None
    args = {"connect_timeout": 3} if url.startswith("postgresql") else {}
    engine = create_engine(url, connect_args=args)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as err:
        first = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise LaunchError(f"--database-url: the database does not answer: {first}") from None
    finally:
        engine.dispose()


def check_run(opts: UpOptions, n_users: int, n_items: int) -> None:
    """LaunchError, before anything starts, for run settings the aggregator would refuse once
    every service is up and every user registered (DP with secure aggregation, a cohort too
    small to mask, a privacy target no noise meets)."""
    from services.aggregator.errors import Malformed
    from services.aggregator.runs import check_before_start
    from services.aggregator.schemas import RunConfig
    from services.launcher import run_config

    try:
        check_before_start(RunConfig(**run_config(opts, n_items)), n_users)
    except Malformed as err:
        raise LaunchError(f"the run settings are refused: {err.detail}") from None


def up(opts: UpOptions) -> dict[str, Any]:
    """Start everything, train, show progress; returns the run history.

    Refuses (LaunchError) before starting anything when the work directory is in use by
    another instance or holds files of a launcher's names that no launcher wrote, or a port is
    taken. An earlier launcher's databases, logs and token in the work directory are replaced. SIGTERM and SIGHUP raise :class:`Stopped` after
    every child is stopped, as Ctrl-C raises KeyboardInterrupt; with ``keep_running``, any of
    them ends the wait normally.
    """
    from fedrecgel.data import load_split

    if opts.workdir.is_dir():  # before the lock file, which marks a folder a launcher used
        check_workdir(opts.workdir, launchers=(opts.workdir / LOCK_FILE).exists())
    with stop_on_signals(), locked_workdir(opts.workdir):
        check_ports(opts)
        check_redis(opts.redis_url)
        check_database(opts.database_url)
        split = load_split(opts.dataset, opts.data_dir, validation=opts.validation)
        check_run(opts, split.n_users, split.n_items)
        clear_workdir(opts.workdir)
        with cluster(opts) as c:
            # a service that dies is started again, with backoff (services.restarts)
            c.restart_dead_services(lambda line: console.print(line, markup=False, highlight=False))
            c.population, c.population_items = split.n_users, split.n_items
            token_file = c.write_operator_token()
            c.start_aggregator()
            console.print(f"aggregator up at {c.agg_url}")
            if opts.dashboard:
                c.start_dashboard()
            if opts.recommend:
                c.start_recommend()
            for i in range(opts.workers):
                c.start_worker(i)
            if opts.dashboard:  # shown once it answers (the workers load their data meanwhile)
                c.wait_healthy(f"{c.dashboard_base}/healthz", "dashboard")
                console.print(f"dashboard: {c.dashboard_url}")
            c.wait_registered(split.n_users)
            console.print(registered(split.n_users, opts.workers))
            c.start_run(split.n_items)
            history = _follow(c, opts)
            _show_popularity(split)
            if opts.recommend:
                _wait_serving(c, len(history.get("rounds", [])))
                _show_recommendations(opts, [str(x) for x in split.user_labels[: opts.show_users]])
            if opts.keep_running:
                _print_try_it(c, opts, token_file)
                with contextlib.suppress(KeyboardInterrupt, Stopped):
                    while True:
                        c.check_alive()
                        time.sleep(1.0)
            return history


def registered(users: int, workers: int) -> str:
    """The line once every user is registered ("by 1 worker", not "by 1 workers")."""
    return f"{users} clients registered by {workers} worker{'s' if workers != 1 else ''}"


def _follow(c: Cluster, opts: UpOptions) -> dict[str, Any]:
    """Show progress until the run finishes; returns its history."""
    history: dict[str, Any] = {}
    with Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("rounds", total=opts.rounds, info="")
        while True:
            c.check_alive()
            try:
                history = c.history()
                rounds = history.get("rounds", [])
                done = len(rounds)
                last_hr = next(
                    (
                        r["metrics"]["hr@10"]
                        for r in reversed(rounds)
                        if r.get("metrics") and "hr@10" in r["metrics"]
                    ),
                    None,
                )
                info = f"HR@10 {last_hr:.4f}" if last_hr is not None else ""
                eps = rounds[-1].get("epsilon") if rounds else None
                if eps is not None:
                    info += f" epsilon {eps:.3f}"
                planned = min(opts.rounds, history.get("planned_rounds") or opts.rounds)
                progress.update(task, total=planned)
                if done < planned:
                    cur = httpx.get(f"{c.agg_url}/v1/rounds/{done + 1}", timeout=5)
                    if cur.status_code == 200:
                        rj = cur.json()
                        info = (
                            f"round {done + 1}: {rj['updates_received']}/{rj['cohort_size']} "
                            "updates in" + (f", {info}" if info else "")
                        )
                progress.update(task, completed=done, info=info)
                if run_complete(history, opts.run):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    rounds = history.get("rounds", [])
    last = rounds[-1] if rounds else None
    if last and last.get("metrics"):
        console.print(f"final round {last['round_id']}: {_figures(last['metrics'])}")
    evaluated = [r for r in rounds if r.get("metrics")]

    # chosen as fedrec train chooses: on the model's own validation HR@10 (with the prior,
    # ``model/val/``), on test only without validation items
    def val_of(r: dict[str, Any]) -> float | None:
        m = r["metrics"]
        v = m.get("model/val/hr@10", m.get("val/hr@10"))
        return None if v is None else float(v)

    has_val = any(val_of(r) is not None for r in evaluated)
    best = max(
        evaluated,
        key=lambda r: (val_of(r) or -1.0) if has_val else float(r["metrics"]["hr@10"]),
        default=None,
    )
    if best:
        on = "validation" if has_val else "test (no validation items to choose on)"
        console.print(f"best round {best['round_id']} on {on}: {_figures(best['metrics'])}")
    elif rounds and not opts.run.eval_every:
        console.print("no round was evaluated (--eval-every 0)")
    return history


def _figures(m: dict[str, float]) -> str:
    """A round's published test figures; with the popularity prior, its weight and the
    model's own HR@10."""
    out = f"HR@10 {m['hr@10']:.4f} NDCG@10 {m['ndcg@10']:.4f}"
    if m.get("prior_weight"):
        out += f" (popularity prior weight {m['prior_weight']:g}; the model alone HR@10 "
        out += f"{m['model/hr@10']:.4f})"
    return out


def _show_popularity(split: Split) -> None:
    """The reference every recommender must beat, on the test candidates the workers rank."""
    from fedrecgel.baselines import popularity

    m = popularity(split).rounds[0].test
    console.print(
        f"popularity (each item's count of users) on the same candidates: "
        f"HR@10 {m['hr@10']:.4f} NDCG@10 {m['ndcg@10']:.4f}"
    )


def _wait_serving(c: Cluster, version: int) -> None:
    """Wait until recommend_api serves model ``version`` with the popularity prior's weight
    the aggregator chose last (it follows both)."""
    deadline = time.monotonic() + c.opts.startup_timeout_s
    while time.monotonic() < deadline:
        c.check_alive()
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            body = httpx.get(f"{c.rec_url}/healthz", timeout=2.0).json()
            prior = httpx.get(
                f"{c.agg_url}/v1/runs/current/prior", headers=c.operator_headers(), timeout=2.0
            ).json()
            weight = prior["weight"] if prior["complete"] else None
            if (body.get("model_version") or -1) >= version and body.get("prior_weight") == (
                weight or None
            ):
                return
        time.sleep(0.3)
    raise LaunchError(f"recommend_api did not load model version {version} in time")


def _show_recommendations(opts: UpOptions, labels: list[str]) -> None:
    """Ask the first users' workers for their top-10, as their devices would, and print them
    (``labels``: those users' ids in the data, shown beside their numbers where they differ)."""
    users = list(range(len(labels)))
    answers: dict[int, list[str]] = {}
    version, weight = None, None
    for user in users:
        port = opts.worker_http_port + user % opts.workers
        url = f"http://{opts.host}:{port}/v1/users/{user}/recommendations?k=10"
        try:
            r = httpx.get(url, timeout=10)
        except httpx.HTTPError as err:
            console.print(f"user {user}: worker not reachable ({err})")
            continue
        if r.status_code != 200:
            console.print(f"user {user}: {r.status_code} {r.text}")
            continue
        body = r.json()
        version, weight = body["model_version"], body.get("prior_weight")
        answers[user] = [f"{it['item']}  {it['score']:+.3f}" for it in body["items"]]
    if not answers:
        return
    served = f"logit + {weight:g} * log(1 + item count)" if weight else "logit"
    table = Table(title=f"top-10 from recommend_api, model v{version} (item, {served})")
    table.add_column("rank", justify="right")
    for user in answers:
        table.add_column(
            f"user {user}" + (f" ({labels[user]})" if labels[user] != str(user) else "")
        )
    for rank in range(max(len(a) for a in answers.values())):
        table.add_row(str(rank + 1), *(a[rank] if rank < len(a) else "" for a in answers.values()))
    Console().print(table)


def _print_try_it(c: Cluster, opts: UpOptions, token_file: Path) -> None:
    lines = [
        f"\nServices are running; Ctrl-C (or `kill {os.getpid()}`) stops them.",
        f"The operator token is in {token_file} (mode 0600)."
        + (f" Dashboard: {c.dashboard_url}" if opts.dashboard else ""),
        "Try:",
        f"  curl -s {c.agg_url}/v1/runs/current/history",
        f'  curl -s -H "Authorization: Bearer $(cat {token_file})" '
        f"{c.agg_url}/v1/models/latest -o model.safetensors",
    ]
    if opts.recommend:
        lines += [
            f"  curl -s 'http://{opts.host}:{opts.worker_http_port}/v1/users/0/recommendations?k=5'",
            f"  curl -s {c.rec_url}/healthz",
        ]
    # not wrapped at the terminal's width: each command stays one line to paste
    console.print("\n".join(lines) + "\n", soft_wrap=True, markup=False, highlight=False)
