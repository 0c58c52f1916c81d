"""Full-catalogue ranking: every held-out item against every item its user has not interacted
with, checked against a ranking written out item by item, and against the sampled metrics on
a split whose sampled negatives are that whole complement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedrecgel.baselines import item_popularity, popularity
from fedrecgel.data import Split, load_split
from fedrecgel.full_ranking import fixed_scores, full_metrics, full_ranks, model_scores
from fedrecgel.metrics import KS, means, metric_sums
from fedrecgel.model import Scorer, init_private, init_shared
from fedrecgel.simulate import TrainConfig
from tests.core.datasets import split_from_rows


def _split(
    n_users: int, n_items: int, per_user: int, seed: int, repeats: bool, negatives: int
) -> Split:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        items = rng.choice(n_items, per_user, replace=False)
        rows += [(u, int(i), t) for t, i in enumerate(items)]
        if repeats:  # the paper protocol keeps a repeated pair: the test item is trained on too
            rows.append((u, int(items[-1]), -1))
    split, _ = split_from_rows(rows, validation=True, n_test_negatives=negatives)
    return split


def _by_hand(split: Split, scores: torch.Tensor) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"test": [], "val": []}
    assert split.val_items is not None
    for u in range(split.n_users):
        for name, target, other in (
            ("test", split.test_items[u], split.val_items[u]),
            ("val", split.val_items[u], split.test_items[u]),
        ):
            known = set(split.user_train(u).tolist()) | {int(other)}
            known.discard(int(target))
            rank = sum(
                1
                for i in range(split.n_items)
                if i != target and i not in known and scores[u, i] >= scores[u, target]
            )
            out[name].append(rank)
    return out


@pytest.mark.parametrize("repeats", [False, True])
def test_ranks_equal_a_count_item_by_item_with_ties_against_the_held_out_item(
    repeats: bool,
) -> None:
    split = _split(40, 30, 8, seed=3, repeats=repeats, negatives=5)
    # integer scores: many ties, each counted against the held-out item
    table = torch.from_numpy(np.random.default_rng(0).integers(0, 4, (40, 30)).astype(np.float32))
    ranks = full_ranks(split, lambda users: table[torch.from_numpy(users)])["model"]
    expected = _by_hand(split, table)
    assert ranks["test"].tolist() == expected["test"]
    assert ranks["val"].tolist() == expected["val"]
    # an offset per item ranks as the scores plus it would
    shift = torch.arange(30, dtype=torch.float32) / 7
    shifted = full_ranks(split, lambda u: table[torch.from_numpy(u)], offsets={"s": shift})
    assert shifted["s"]["test"].tolist() == _by_hand(split, table + shift)["test"]


def test_with_the_whole_complement_sampled_the_full_and_sampled_metrics_agree() -> None:
    # 8 distinct items of 30 per user: 6 trained on, so 30 - 6 - 1 other held-out item - 1
    # target = 22 items compete with each held-out item, all of them its sampled negatives
    split = _split(40, 30, 8, seed=5, repeats=False, negatives=22)
    cfg = TrainConfig().model(split.n_items)
    scorer = Scorer(cfg, init_shared(cfg, 1))
    private = init_private(cfg, 1, np.arange(split.n_users))
    full = full_metrics(split, model_scores(scorer, private))["model"]
    test = means(metric_sums(scorer, private, split.test_items, split.test_negatives, KS))
    assert split.val_items is not None and split.val_negatives is not None
    val = means(metric_sums(scorer, private, split.val_items, split.val_negatives, KS))
    for k in ("hr@10", "ndcg@10", "hr@5"):
        assert full[k] == pytest.approx(test[k])
        assert full[f"val/{k}"] == pytest.approx(val[k])
    # so does popularity, ranked by the count of users holding an item
    pop = full_metrics(split, fixed_scores(item_popularity(split)))["model"]
    assert pop["hr@10"] == pytest.approx(popularity(split).rounds[0].test["hr@10"])


def test_a_larger_catalogue_ranks_lower_than_its_sample() -> None:
    split = _split(60, 200, 10, seed=7, repeats=True, negatives=20)
    pop = fixed_scores(item_popularity(split))
    full = full_metrics(split, pop)["model"]
    assert full["hr@10"] < popularity(split).rounds[0].test["hr@10"]
    some = np.arange(0, 60, 3)
    part = full_metrics(split, pop, users=some)["model"]
    ranks = full_ranks(split, pop)["model"]["test"]
    assert part["hr@10"] == pytest.approx(float((ranks[some] < 10).double().mean()))


def test_train_ranks_its_served_model_over_the_whole_catalogue(tmp_path: Path) -> None:
    from fedrecgel.cli import app

    out = tmp_path / "o"
    args = ["train", "--rounds", "4", "--eval-every", "2", "--fraction", "0.05", "--factor", "8"]
    r = CliRunner().invoke(app, [*args, "--full-ranking", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    run = json.loads((out / "results.json").read_text())["runs"][0]
    full = run["full_ranking"]
    assert full["round"] == run["selected_on_validation"]["round"]
    for name in ("model", "served", "served_full_weight", "popularity"):
        assert set(full[name]) == {"hr@10", "ndcg@10", "hr@20", "ndcg@20", "val/hr@10"}
    split = load_split("filmtrust", validation=True)
    pop = full_metrics(split, fixed_scores(item_popularity(split)))["model"]
    assert full["popularity"]["hr@10"] == pytest.approx(pop["hr@10"])
    assert f"popularity {pop['hr@10']:.4f}" in r.output
    assert "whole catalogue, round" in r.output
    for refused, why in (
        (["--method", "popularity"], "--method popularity serves no federated model"),
        (["--no-validation"], "--no-validation leaves nothing to choose"),
    ):
        r = CliRunner().invoke(app, ["train", "--full-ranking", *refused, "--out", str(out)])
        assert r.exit_code == 2 and why in r.output, r.output
