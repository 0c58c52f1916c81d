"""Private popularity: noisy item counts at user-level (epsilon, delta)-DP. The noise against the
accountant (and the exact privacy curve of the Gaussian mechanism), the bound on what one user
adds, seeded repeats, the two ends of the budget, and the command line around it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from fedrecgel.accountant import release_epsilon
from fedrecgel.baselines import item_popularity, popularity
from fedrecgel.cli import app
from fedrecgel.clitools import load_data
from fedrecgel.config import ConfigError
from fedrecgel.data import Interactions, Split, apply_protocol
from fedrecgel.dp_popularity import (
    DEFAULT_MAX_ITEMS,
    dp_popularity,
    noisy_counts,
    plan_release,
)
from fedrecgel.prior import split_bounded_counts, user_draw
from fedrecgel.synthetic import synthetic_split

runner = CliRunner()


def _popular_split(n_users: int = 60) -> Split:
    """Users who all like items 0..9 (six of them, in a per-user order, the latest held out)
    plus four of their own from the long tail: 10 distinct training items at most."""
    rng = np.random.default_rng(0)
    users, items, times = [], [], []
    for u in range(n_users):
        own = rng.choice(np.arange(10, 200), size=4, replace=False)
        seq = [*rng.permutation(10)[:6], *own]
        for t, i in enumerate(seq):
            users.append(u)
            items.append(int(i))
            times.append(t if i >= 10 else 100 + t)
    raw = Interactions("pop", np.array(users), np.array(items), np.array(times))
    return apply_protocol(raw, n_test_negatives=20, validation=True)


def _exact_delta(eps: float, z: float) -> float:
    """The Gaussian mechanism's exact delta at ``eps`` for noise multiplier ``z`` (Balle & Wang
    2018, Theorem 8)."""
    return float(norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z))


# ----------------------------------------------------------------------------- the release


def test_one_release_matches_the_librarys_documented_epsilon() -> None:
    """dp-accounting documents noise multiplier 4.530877117 as (1, 1e-6)-DP for one Gaussian."""
    assert release_epsilon(4.530877117, 1e-6) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("target", [0.5, 1.0, 3.0, 8.0])
def test_the_noise_multiplier_spends_the_target_and_no_more(target: float) -> None:
    n = 1227
    r = plan_release(n, 10, target_epsilon=target)
    assert r.delta == pytest.approx(1 / n) and r.max_items == 10
    assert r.epsilon <= target and r.epsilon == pytest.approx(target, abs=1e-3)
    # the accountant's public interface at that z says the same
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    acc.compose(dp_accounting.GaussianDpEvent(r.noise))
    assert acc.get_epsilon(r.delta) == pytest.approx(r.epsilon, rel=1e-9)
    # the smallest such z: one a little smaller overspends
    assert release_epsilon(r.noise * 0.995, r.delta) > target
    # and RDP bounds the exact privacy curve: at (epsilon, z) the exact delta is within
    assert _exact_delta(r.epsilon, r.noise) <= r.delta
    assert r.sensitivity == pytest.approx(math.sqrt(10))
    assert r.noise_std == pytest.approx(r.noise * math.sqrt(10))


def test_the_noise_has_std_z_sqrt_k_on_every_item() -> None:
    split = synthetic_split(300, 4000, interactions_per_user=12, seed=1, validation=True)
    r = plan_release(split.n_users, 4, target_epsilon=2.0)
    noise = noisy_counts(split, r, seed=5) - split_bounded_counts(split, 4, seed=5)
    assert abs(float(noise.mean())) < 4 * r.noise_std / math.sqrt(split.n_items)
    assert float(noise.std()) == pytest.approx(r.noise_std, rel=0.05)


def test_each_user_adds_at_most_k_of_its_own_distinct_items() -> None:
    split = synthetic_split(200, 300, interactions_per_user=15, seed=2, validation=True)
    k, seed = 5, 7
    total = np.zeros(split.n_items, dtype=np.int64)
    for u in range(split.n_users):
        own = split.user_train(u)
        drawn = user_draw(own, k, seed, u)
        assert len(drawn) == min(k, len(np.unique(own))) and len(set(drawn)) == len(drawn)
        assert set(drawn) <= set(own)
        # the draw is a function of the user's own items, the seed and its id only
        assert np.array_equal(drawn, user_draw(own.copy(), k, seed, u))
        one = np.bincount(drawn, minlength=split.n_items)
        assert np.linalg.norm(one) <= math.sqrt(k) + 1e-12  # the L2 sensitivity
        total += one
    assert np.array_equal(total, split_bounded_counts(split, k, seed))
    # users with more than k items are sampled, differently under another seed
    assert not np.array_equal(total, split_bounded_counts(split, k, seed + 1))
    # a k above every profile counts every distinct training item once
    everyone = split_bounded_counts(split, 10**6, seed)
    assert np.array_equal(everyone, item_popularity(split))


# ----------------------------------------------------------------------------- the ranking


def test_the_same_seed_gives_the_same_ranking() -> None:
    split = _popular_split()
    r = plan_release(split.n_users, 10, target_epsilon=1.0)
    a, b, c = dp_popularity(split, r, 3), dp_popularity(split, r, 3), dp_popularity(split, r, 4)
    assert np.array_equal(noisy_counts(split, r, 3), noisy_counts(split, r, 3))
    assert not np.array_equal(noisy_counts(split, r, 3), noisy_counts(split, r, 4))
    assert a.rounds[0].test == b.rounds[0].test and a.rounds[0].val == b.rounds[0].val
    assert a.config == {"method": "popularity", "seed": 3, "dp_max_items": 10}
    assert c.config["seed"] == 4
    assert a.privacy is not None and a.privacy["epsilon"] == r.epsilon == a.rounds[0].epsilon


def test_a_huge_budget_is_popularity_and_a_tiny_one_is_chance() -> None:
    split = _popular_split()
    plain = popularity(split).selected()
    assert plain is not None and plain["hr@10"] == pytest.approx(1.0)
    big = plan_release(split.n_users, 10, target_epsilon=1000.0)
    # k covers every profile: the counts are popularity's, the noise below half a count
    assert np.array_equal(np.rint(noisy_counts(split, big, 0)), item_popularity(split))
    assert dp_popularity(split, big, 0).selected() == plain
    small = plan_release(split.n_users, 10, target_epsilon=0.01)
    hrs = [dp_popularity(split, small, s).rounds[0].test["hr@10"] for s in range(30)]
    # the held-out item among 21 candidates: chance puts it in the top 10 with p = 10/21
    assert abs(float(np.mean(hrs)) - 10 / 21) < 0.1
    mid = plan_release(split.n_users, 10, target_epsilon=3.0)
    hr_mid = np.mean([dp_popularity(split, mid, s).rounds[0].test["hr@10"] for s in range(5)])
    assert float(np.mean(hrs)) < hr_mid <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"target_epsilon": -1.0}, "target_epsilon"),
        ({"target_epsilon": math.nan}, "target_epsilon"),
        ({"target_epsilon": math.inf}, "target_epsilon"),
        ({"target_epsilon": 3.0, "max_items": 0}, "dp_max_items"),
        ({"target_epsilon": 3.0, "max_items": -2}, "dp_max_items"),
        ({"target_epsilon": 3.0, "max_items": 2.5}, "dp_max_items"),
        ({"target_epsilon": 3.0, "delta": 0.0}, "dp_delta"),
        ({"target_epsilon": 3.0, "delta": 1.0}, "dp_delta"),
        ({"noise": 0.0}, "dp_noise"),
        ({}, "target_epsilon"),
        ({"noise": 0.5, "target_epsilon": 1.0}, "target_epsilon"),  # spends about 8.5
    ],
)
def test_bad_settings_name_the_setting(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_release(1000, **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


# ----------------------------------------------------------------------------- the command line


def _results(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def test_fedrec_train_private_popularity_records_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "dp"
    args = ["train", "--method", "popularity", "--target-epsilon", "3", "--seeds", "0,1"]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = _results(out)
    assert res["method"] == "popularity" and len(res["runs"]) == 2
    p = res["runs"][0]["privacy"]
    assert p["max_items"] == DEFAULT_MAX_ITEMS and p["delta"] == pytest.approx(1 / 1227)
    assert p["epsilon"] <= 3.0 and p["epsilon"] == pytest.approx(3.0, abs=1e-3)
    assert p["noise_multiplier"] == pytest.approx(plan_release(1227, 10, 3.0).noise)
    assert res["runs"][0]["rounds"][0]["epsilon"] == p["epsilon"]
    hr = res["summary"]["selected.hr@10.mean"]
    assert 0.8 < hr < 0.92  # FilmTrust: plain popularity 0.911, chance about 0.1
    assert res["runs"][0]["rounds"] != res["runs"][1]["rounds"]  # two seeds, two noise draws
    again = tmp_path / "again"
    assert runner.invoke(app, [*args, "--out", str(again)]).exit_code == 0
    assert [x["rounds"][0]["test"] for x in _results(again)["runs"]] == [
        x["rounds"][0]["test"] for x in res["runs"]
    ]
    k5 = tmp_path / "k5"
    more = ["--dp-max-items", "5", "--dp-delta", "1e-6", "--seeds", "0"]
    r = runner.invoke(app, [*args[:-2], *more, "--out", str(k5)])
    assert r.exit_code == 0, r.output
    p5 = _results(k5)["runs"][0]["privacy"]
    assert (
        p5["max_items"] == 5
        and p5["delta"] == 1e-6
        and p5["noise_multiplier"] > p["noise_multiplier"]
    )


def test_without_a_dp_setting_popularity_is_unchanged(tmp_path: Path) -> None:
    """The figures bench/results/baselines.json recorded for FilmTrust before private
    popularity existed, exactly."""
    r = runner.invoke(app, ["train", "--method", "popularity", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (run,) = _results(tmp_path / "o")["runs"]
    assert run["privacy"] is None and run["config"] == {"method": "popularity"}
    assert run["rounds"][0]["epsilon"] is None
    assert run["selected_on_validation"]["hr@10"] == 0.9111654441727791


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--method", "popularity", "--target-epsilon", "0"], "--target-epsilon: Input should be greater than 0"),
        (["--method", "popularity", "--target-epsilon", "-2"], "--target-epsilon: Input should be greater than 0"),
        (["--method", "popularity", "--target-epsilon", "3", "--dp-max-items", "0"], "--dp-max-items must be at least 1, got 0"),
        (["--method", "popularity", "--dp-max-items", "5"], "--dp-max-items is a setting of --method popularity with"),
        (["--dp-max-items", "5", "--target-epsilon", "3"], "--dp-max-items is a setting of --method popularity with"),
        (["--method", "popularity", "--target-epsilon", "3", "--dp-clip", "2"], "--dp-clip is a setting of the federated DP runs"),
        (["--method", "popularity", "--dp-noise", "0.5", "--target-epsilon", "1"], "--target-epsilon: dp_noise 0.5 spends epsilon"),
        (["--method", "central", "--target-epsilon", "3"], "--method central is not differentially private"),
        (["--method", "random", "--dp-noise", "1"], "--method random is not differentially private"),
    ],
)  # fmt: skip
def test_bad_private_popularity_input_is_a_clear_error(
    args: list[str], said: str, tmp_path: Path
) -> None:
    r = runner.invoke(app, ["train", *args, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert said in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not (tmp_path / "o" / "results.json").exists()


# ----------------------------------------------------------------------------- the benchmark

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.dp_popularity", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )


def test_the_benchmark_chooses_k_on_validation_and_refuses_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    small = ["--datasets", "filmtrust/paper", "--k-grid", "2,10", "--seeds", "0", "--out", str(out)]
    r = _bench(*small, "--epsilons", "3")
    assert r.returncode == 0, r.stderr
    cell = json.loads(out.read_text())["datasets"]["filmtrust/paper"]["epsilons"]["3"]
    val = cell["validation_hr@10_by_k"]
    assert cell["chosen_k"] == max((2, 10), key=lambda k: (val[str(k)], -k))
    assert cell["tuned"]["k"] == cell["chosen_k"] and cell["tuned"]["epsilon"] <= 3.0
    assert cell["default"]["k"] == DEFAULT_MAX_ITEMS
    for args, said in (
        (["--epsilons", "0"], "error: target_epsilon: must be a number > 0"),
        (["--datasets", "nope/paper"], "error: unknown dataset 'nope'"),
        (["--tuning-seed", "0"], "--tuning-seed must be apart from the reported --seeds"),
        (["--k-grid", "0,5"], "--k-grid: every K must be at least 1"),
    ):
        r = _bench(*small, *args)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_federated_run_reports_popularity_and_under_dp_popularity_at_its_budget(
    tmp_path: Path,
) -> None:
    """results.json's ``references``: popularity on the run's split, and for a DP run the DP
    count at the epsilon the run spent (its delta, the shipped k, one draw per seed)."""
    rows = [f"{u},{(u * 7 + k * 5) % 150},{k}" for u in range(40) for k in range(6)]
    csv = tmp_path / "d.csv"
    csv.write_text("\n".join(rows) + "\n")
    args = ["train", "--dataset", str(csv), "--rounds", "2", "--fraction", "0.5", "--factor", "4"]
    args += ["--layers", "1", "--optimizer", "sgd", "--quiet", "--seeds", "0,1"]
    plain = tmp_path / "plain"
    r = runner.invoke(app, [*args, "--out", str(plain)])
    assert r.exit_code == 0, r.output
    refs = _results(plain)["references"]
    split = load_data(str(csv), None, validation=False)  # the run's split: the same loader
    want_pop = popularity(split).rounds[0].test
    assert refs == {"popularity": {k: want_pop[k] for k in ("hr@10", "ndcg@10")}}
    assert "on this split, popularity: HR@10" in " ".join(r.output.split())

    dp = tmp_path / "dp"
    r = runner.invoke(app, [*args, "--dp-noise", "1.0", "--out", str(dp)])
    assert r.exit_code == 0, r.output
    res = _results(dp)
    spent = max(run["privacy"]["epsilon_spent"] for run in res["runs"])
    release = plan_release(40, DEFAULT_MAX_ITEMS, spent, delta=1 / 40)
    want = [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in (0, 1)]
    got = res["references"]["dp_popularity"]
    assert got["epsilon"] <= spent and got["max_items"] == DEFAULT_MAX_ITEMS
    assert got["seeds"] == [0, 1] and got["hr@10.mean"] == pytest.approx(np.mean(want))
    assert "popularity under the same budget (epsilon" in " ".join(r.output.split())
