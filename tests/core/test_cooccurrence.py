"""Co-occurrence ranking and its private release: the sensitivity the accounting assumes, the
noise, what the ranking learns on data with tastes, and the command line around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from fedrecgel import cooccurrence as co
from fedrecgel import item_spectrum as sp
from fedrecgel.baselines import popularity, random_ranking
from fedrecgel.cli import app
from fedrecgel.data import Split
from fedrecgel.synthetic import synthetic_split

runner = CliRunner()


def _tastes(n_users: int = 400, validation: bool = True) -> Split:
    return synthetic_split(
        n_users,
        120,
        interactions_per_user=12,
        skew=1.5,
        seed=3,
        validation=validation,
        groups=6,
        affinity=0.9,
        n_test_negatives=50,
    )


def test_one_user_moves_the_co_occurrence_by_at_most_one() -> None:
    """The accounting's sensitivity: G with and without a user differ by ||x x^T||_F = 1."""
    split = _tastes(60)
    x = sp.history(split)
    g = sp.co_occurrence(x)
    for u in (0, 7, 59):
        keep = np.setdiff1d(np.arange(split.n_users), [u])
        without = sp.co_occurrence(x[keep])
        assert np.linalg.norm(g - without) == pytest.approx(1.0, rel=1e-5)


def test_the_release_is_symmetric_noise_of_std_z_and_repeats_by_seed() -> None:
    g = np.zeros((300, 300), dtype=np.float32)
    n = sp.noisy_release(g, 2.0, seed=4)
    assert np.array_equal(n, n.T)
    off = n[np.triu_indices(300, 1)]
    assert off.std() == pytest.approx(2.0, rel=0.02)
    assert np.diag(n).std() == pytest.approx(2.0 * np.sqrt(2), rel=0.15)
    assert np.array_equal(n, sp.noisy_release(g, 2.0, seed=4))
    assert not np.array_equal(n, sp.noisy_release(g, 2.0, seed=5))


def test_on_data_with_tastes_it_beats_popularity_and_noise_takes_that_away() -> None:
    split = _tastes()
    exact = co.cooccurrence(split)
    pop = popularity(split).rounds[0].test["hr@10"]
    rnd = random_ranking(split).rounds[0].test["hr@10"]
    got = exact.rounds[0].test["hr@10"]
    assert got > pop + 0.1, (got, pop)
    assert exact.config["rank"] in co.RANKS
    # the rank is the validation's best of those tried
    ranks = {r: co.cooccurrence(split, rank=r).rounds[0].val["hr@10"] for r in (1, 4, 16)}
    assert exact.rounds[0].val["hr@10"] >= max(ranks.values())
    drowned = co.cooccurrence(split, noise=1e4, seed=0).rounds[0].test["hr@10"]
    assert abs(drowned - rnd) < 0.1 < got - drowned


def test_without_validation_the_default_rank_and_bad_input_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    split = _tastes(80, validation=False)
    assert co.cooccurrence(split).config["rank"] == co.DEFAULT_RANK
    with pytest.raises(ValueError, match="rank must be in"):
        co.cooccurrence(split, rank=0)
    monkeypatch.setattr(co, "MAX_ITEMS", 100)
    with pytest.raises(ValueError, match="more than the 100"):
        co.cooccurrence(split)


def _results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def test_fedrec_train_private_cooccurrence_records_its_budget(tmp_path: Path) -> None:
    args = ["train", "--method", "cooccurrence", "--target-epsilon", "3"]
    r = runner.invoke(app, [*args, "--seeds", "0,1", "--out", str(tmp_path / "dp")])
    assert r.exit_code == 0, r.output
    res = _results(tmp_path / "dp")
    runs = res["runs"]
    assert isinstance(runs, list) and len(runs) == 2
    p = runs[0]["privacy"]
    assert p["mechanism"] == "gaussian item co-occurrence, one release"
    assert p["epsilon"] == pytest.approx(3.0, abs=1e-3) and p["sensitivity"] == 1.0
    assert runs[0]["rounds"][0]["epsilon"] == p["epsilon"]
    assert "dp_popularity" in res["references"]
    plain_args = ["train", "--method", "cooccurrence", "--no-validation"]
    r = runner.invoke(app, [*plain_args, "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    (plain,) = _results(tmp_path / "p")["runs"]
    assert plain["privacy"] is None and plain["config"]["rank"] == co.DEFAULT_RANK
    assert plain["rounds"][0]["test"]["hr@10"] > 0.9  # FilmTrust: popularity 0.911


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--target-epsilon", "3", "--dp-clip", "2"], "--dp-clip is a setting of the federated DP runs"),
        (["--target-epsilon", "3", "--dp-max-items", "5"], "--dp-max-items is a setting of --method popularity"),
        (["--dp-noise", "0.5", "--target-epsilon", "1"], "--target-epsilon: dp_noise 0.5 spends epsilon"),
    ],
)  # fmt: skip
def test_bad_private_cooccurrence_input_is_a_clear_error(
    args: list[str], said: str, tmp_path: Path
) -> None:
    r = runner.invoke(app, ["train", "--method", "cooccurrence", *args, "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert said in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
