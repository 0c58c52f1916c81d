"""The compose demo's follower (deploy/start_run.py) when a worker is gone: its quorum and
deadline settings, the line naming the shard whose clients do not upload, and the note on a
round that closed without them (its model differs from an undisturbed run's)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from fedrecgel.config import SIMULATOR_ONLY
from fedrecgel.presets import FIXED_PRIVATE_CLIP, stored
from fedrecgel.run_config import RunConfig
from tests.deploy.manifests import ROOT, compose, deploy_script, fake_compose_env

WORKERS = ["http://worker-0:8710", "http://worker-1:8710"]


start_run = deploy_script("start_run")


def test_quorum_and_deadline_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_CONFIG", '{"fraction": 0.1, "seed": 0, "n_items": 2059}')
    monkeypatch.setenv("RUN_QUORUM", "0.3")
    monkeypatch.setenv("RUN_DEADLINE_S", "45")
    cfg = start_run.run_config()
    assert cfg["quorum"] == 0.3 and cfg["deadline_s"] == 45.0
    for variable, bad in (("RUN_QUORUM", "1.5"), ("RUN_QUORUM", "nan"), ("RUN_DEADLINE_S", "x")):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(start_run.DemoError, match=f"{variable} must be a number .* {bad!r}"):
            start_run.run_config()
        monkeypatch.setenv(variable, "1")


def test_the_missing_line_names_the_shard_its_worker_and_what_the_deadline_does() -> None:
    info = {
        "round_id": 4,
        "updates_received": 59,
        "cohort_size": 122,
        "deadline": "2026-12-02T10:11:12.5+00:00",
        "missing_by_shard": {"1/2": 63},
    }
    line = start_run.missing_line(20, info, 0.3, WORKERS, answering=lambda url: False)
    assert line.startswith("round   4/20: 59/122 updates, none for 15 s; not uploaded: ")
    assert "shard 1 of 2 (http://worker-1:8710): does not answer, 63 clients" in line
    assert "At its deadline (10:11:12 UTC) the round closes without them" in line
    assert "(quorum 0.3: 37 of 122)" in line
    below = start_run.missing_line(20, info, 1.0, WORKERS, answering=lambda url: True)
    assert ": answers, 63 clients" in below
    assert "is retried with a new cohort unless 63 more come" in below


def test_a_round_closed_without_a_shard_or_after_a_retry_says_its_model_differs() -> None:
    assert start_run.closed_note({"attempt": 0, "missing_by_shard": {}}, WORKERS) == ""
    note = start_run.closed_note({"attempt": 0, "missing_by_shard": {"1/2": 61}}, WORKERS)
    assert note == (
        "closed without the uploads of shard 1 of 2 (http://worker-1:8710): 61: "
        "from this round on the model differs from an undisturbed run's"
    )
    retried = start_run.closed_note({"attempt": 1, "missing_by_shard": {}}, WORKERS)
    assert retried.startswith("closed at attempt 2 (retried below quorum, a new cohort): from")
    # a shard count other than the workers' list: named without a URL
    assert "shard 2 of 3: 5" in start_run.closed_note({"missing_by_shard": {"2/3": 5}}, WORKERS)


def test_following_a_run_whose_worker_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 1 sits at shard 0's uploads while shard 1's clients are missing: the follower names
    shard 1 once; round 1 then closes without them (noted), round 2 closes complete."""
    state = {"polls": 0}
    metrics = {"hr@10": 0.5, "ndcg@10": 0.3}

    def closed(rid: int, n: int) -> dict[str, Any]:
        return {"round_id": rid, "n_updates": n, "loss": 0.5, "seconds": 1.0, "metrics": metrics}

    def fake_request(
        url: str, token: Any = None, data: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        path = urlsplit(url).path
        if path == "/v1/rounds/current":
            return 200, {"run_id": 1, "state": "open", "config": {"rounds": 2, "quorum": 0.3}}
        if path == "/v1/runs/current/history":
            state["polls"] += 1
            rounds = [closed(1, 5)] if state["polls"] > 3 else []
            if state["polls"] > 5:
                rounds.append(closed(2, 10))
            return 200, {"run_id": 1, "rounds": rounds, "next_after": None}
        if path == "/v1/rounds/1":
            open_ = state["polls"] <= 3
            return 200, {
                "round_id": 1,
                "attempt": 0,
                "state": "open" if open_ else "closed",
                "updates_received": 5,
                "cohort_size": 10,
                "deadline": "2026-12-02T10:11:12+00:00",
                "missing_by_shard": {"1/2": 5},
            }
        if path == "/v1/rounds/2":
            done = state["polls"] > 5
            return 200, {
                "round_id": 2,
                "attempt": 0,
                "state": "closed" if done else "open",
                "updates_received": 10 if done else 0,
                "cohort_size": 10,
                "missing_by_shard": {} if done else {"0/2": 5, "1/2": 5},
            }
        if path == "/healthz":  # worker-1 is gone
            return (0, None) if "worker-1" in url else (200, {})
        return 404, None

    lines: list[str] = []
    monkeypatch.setattr(start_run, "_request", fake_request)
    monkeypatch.setattr(start_run, "say", lines.append)
    monkeypatch.setattr(start_run, "QUIET_S", 0.0)
    done = start_run.follow("http://aggregator", "token", poll_s=0.0, workers=WORKERS)
    assert done["rounds"] == 2
    told = [line for line in lines if "not uploaded" in line]
    assert len(told) == 1, lines
    assert "shard 1 of 2 (http://worker-1:8710): does not answer, 5 clients" in told[0]
    notes = [line for line in lines if "differs from an undisturbed" in line]
    assert notes == [
        "round   1/2: closed without the uploads of shard 1 of 2 (http://worker-1:8710): 5: "
        "from this round on the model differs from an undisturbed run's"
    ]


def test_the_follower_stops_waiting_for_an_evaluation_a_gone_worker_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both rounds closed, round 2's evaluation never comes (a worker that never returns does
    not report): the follower returns after its wait with round 2 unevaluated, not never."""
    metrics = {"hr@10": 0.5, "ndcg@10": 0.3}
    rounds: list[dict[str, Any]] = [
        {"round_id": 1, "n_updates": 10, "loss": 0.5, "seconds": 1.0, "metrics": metrics},
        {"round_id": 2, "n_updates": 5, "loss": 0.5, "seconds": 1.0, "metrics": None},
    ]

    def fake_request(
        url: str, token: Any = None, data: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        path = urlsplit(url).path
        if path == "/v1/rounds/current":
            return 200, {"run_id": 1, "state": "finished", "config": {"rounds": 2}}
        if path == "/v1/runs/current/history":
            return 200, {"run_id": 1, "rounds": rounds, "next_after": None}
        if path.startswith("/v1/rounds/"):
            return 200, {"round_id": int(path.rsplit("/", 1)[1]), "attempt": 0}
        return 404, None

    monkeypatch.setattr(start_run, "_request", fake_request)
    monkeypatch.setattr(start_run, "say", lambda line: None)
    done = start_run.follow("http://aggregator", "token", poll_s=0.01, eval_wait_s=0.3)
    assert done["unevaluated"] == [2] and done["rounds"] == 2
    assert done["seconds"] >= 0.3
    # with every evaluation in, it returns at once
    rounds[1]["metrics"] = metrics
    done = start_run.follow("http://aggregator", "token", poll_s=0.01, eval_wait_s=60)
    assert done["unevaluated"] == [] and done["seconds"] < 30


def test_the_follower_waits_only_for_the_rounds_the_run_evaluates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of 3 rounds with eval_every 2 evaluates rounds 2 and 3 (the last): round 1 never
    gets metrics and is shown without them at once; the follower returns as soon as rounds 2
    and 3 have theirs, and waits (naming it) while round 3's is missing."""
    metrics = {"hr@10": 0.5, "ndcg@10": 0.3}
    rounds: list[dict[str, Any]] = [
        {"round_id": r, "n_updates": 10, "loss": 0.5, "seconds": 1.0, "metrics": m}
        for r, m in ((1, None), (2, metrics), (3, None))
    ]

    def fake_request(
        url: str, token: Any = None, data: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        path = urlsplit(url).path
        if path == "/v1/rounds/current":
            config = {"rounds": 3, "eval_every": 2}
            return 200, {"run_id": 1, "state": "finished", "config": config}
        if path == "/v1/runs/current/history":
            return 200, {"run_id": 1, "rounds": rounds, "next_after": None}
        if path.startswith("/v1/rounds/"):
            return 200, {"round_id": int(path.rsplit("/", 1)[1]), "attempt": 0}
        return 404, None

    lines: list[str] = []
    monkeypatch.setattr(start_run, "_request", fake_request)
    monkeypatch.setattr(start_run, "say", lines.append)
    done = start_run.follow("http://aggregator", "token", poll_s=0.01, eval_wait_s=0.3)
    assert done["unevaluated"] == [3] and done["seconds"] >= 0.3
    rounds[2]["metrics"] = metrics
    lines.clear()
    done = start_run.follow("http://aggregator", "token", poll_s=0.01, eval_wait_s=60)
    assert done["unevaluated"] == [] and done["seconds"] < 30
    shown = {line.split(":")[0]: line for line in lines if "closed:" in line}
    assert shown["round   1/3 closed"].endswith("loss 0.5000  (1.0 s)"), shown
    assert "HR@10 0.5000" in shown["round   2/3 closed"]
    assert "HR@10 0.5000" in shown["round   3/3 closed"]


def test_the_end_compares_the_last_evaluated_round_with_popularity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedrecgel.baselines import popularity
    from fedrecgel.data import load_split

    pop = popularity(load_split("filmtrust", validation=True)).rounds[0].test  # the workers'
    assert round(pop["hr@10"], 4) == 0.9112  # the figure the README quotes for it
    history = {
        "rounds": [
            {"round_id": 10, "metrics": {"hr@10": 0.5, "ndcg@10": 0.25}},
            {"round_id": 11, "metrics": None},
        ]
    }
    start_run.compare_with_popularity("filmtrust", history)
    line = capsys.readouterr().out.strip()
    assert line.startswith("round 10 HR@10 0.5000  NDCG@10 0.2500; popularity (")
    assert line.endswith(f"candidates: HR@10 {pop['hr@10']:.4f}  NDCG@10 {pop['ndcg@10']:.4f}")
    start_run.compare_with_popularity("filmtrust", {"rounds": [history["rounds"][1]]})
    assert capsys.readouterr().out.startswith("no round evaluated; popularity (")
    start_run.compare_with_popularity("nonesuch", history)
    assert capsys.readouterr().out.startswith("popularity on nonesuch: not computed (")


def test_the_compose_demo_trains_as_the_readme_demo_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``docker compose up`` without a .env posts the settings of ``scripts/demo.sh`` (its
    rounds, evaluations and upload grouping), as a RunConfig the aggregator accepts."""
    env = compose()["services"]["demo"]["environment"]
    for key in ("RUN_CONFIG", "RUN_ROUNDS", "RUN_QUORUM", "RUN_DEADLINE_S", "RUN_DATASET"):
        monkeypatch.setenv(key, fake_compose_env(env[key]))
    cfg = RunConfig.model_validate(start_run.run_config())
    script = (ROOT / "scripts" / "demo.sh").read_text()
    flags = dict(re.findall(r"--(rounds|eval-every|upload-grouping) (\w+)", script))
    assert len(flags) == 3, script
    assert (str(cfg.rounds), str(cfg.eval_every), cfg.upload_grouping) == (
        flags["rounds"],
        flags["eval-every"],
        flags["upload-grouping"],
    )


def test_a_private_preset_posts_the_fixed_clip_norm_the_aggregator_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RUN_PRESET=private: its adaptive clip norm (simulator only, which the aggregator refuses
    in a DP run) is posted as the fixed one `fedrec up` takes."""
    monkeypatch.setenv("RUN_CONFIG", '{"fraction": 0.1, "seed": 0, "target_epsilon": 3}')
    monkeypatch.setenv("RUN_PRESET", "private")
    cfg = RunConfig.model_validate(start_run.run_config())
    assert cfg.dp_enabled and cfg.optimizer == stored()["private"]["settings"]["optimizer"]
    assert [n for n in SIMULATOR_ONLY if getattr(cfg, n) is not None] == []
    assert cfg.dp_clip == FIXED_PRIVATE_CLIP
