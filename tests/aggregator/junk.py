"""What a hostile holder of a valid client token sends: upload bodies and evaluation reports
that break a rule the aggregator must enforce (each one must be refused with a 4xx and change
nothing)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.model import ModelConfig
from fedrecgel.wire import encode_updates
from tests.support.aggregator import random_update

OCTET = "application/octet-stream"


def junk_uploads(
    cfg: ModelConfig, round_id: int, client_id: int, seed: int = 0
) -> dict[str, tuple[bytes, str | None]]:
    """name -> (body, Content-Type) of uploads for ``client_id`` that must be refused."""
    rng = np.random.default_rng(seed)
    good = random_update(cfg, client_id, rng)

    def body(**meta: object) -> bytes:
        return encode_updates(round_id, [dataclasses.replace(good, **meta)])  # type: ignore[arg-type]

    return {
        "loss_nan": (body(loss=float("nan")), OCTET),
        "loss_inf": (body(loss=float("inf")), OCTET),
        "loss_negative": (body(loss=-1.0), OCTET),
        "loss_huge": (body(loss=1e300), OCTET),
        "n_samples_2_70": (body(n_samples=2**70), OCTET),
        "n_samples_2_31": (body(n_samples=2**31), OCTET),
        "n_samples_zero": (body(n_samples=0), OCTET),
        "wrong_round": (encode_updates(round_id + 7, [good]), OCTET),
        "garbage": (b"\x00" * 64, OCTET),
        "text_plain": (encode_updates(round_id, [good]), "text/plain"),
        "json": (encode_updates(round_id, [good]), "application/json"),
        "no_content_type": (encode_updates(round_id, [good]), None),
    }


def junk_reports(version: int, own: list[int], foreign: list[int]) -> dict[str, object]:
    """name -> a ``POST /v1/evaluations`` body (JSON, or raw text) that must be refused."""
    n = len(own)

    def report(sums: dict[str, object], ids: list[int] = own, count: object = n) -> object:
        return {"model_version": version, "sums": sums, "count": count, "client_ids": ids}

    # every metric a report carries (at 0), so each case fails on what it names
    full: dict[str, object] = {name: 0.0 for name in METRIC_NAMES}
    rest = "".join(f'"{name}": 0.0, ' for name in METRIC_NAMES if name != "hr@10")
    return {
        "overflow": report({**full, "hr@10": 1e308, "ndcg@10": 1e308}),
        "sum_above_count": report({**full, "hr@10": n + 0.5}),
        "negative": report({**full, "hr@10": -1.0}),
        "nan_literal": (
            f'{{"model_version": {version}, "sums": {{{rest}"hr@10": NaN}}, "count": {n}, '
            f'"client_ids": {own}}}'
        ),
        "infinity_literal": (
            f'{{"model_version": {version}, "sums": {{{rest}"hr@10": Infinity}}, "count": {n}, '
            f'"client_ids": {own}}}'
        ),
        "count_mismatch": report(full, count=n + 1),
        "huge_version": {**report(full), "model_version": 2**70},  # type: ignore[dict-item]
        "count_as_string": report(full, count=str(n)),
        "ids_as_bools": report(full, ids=[False] * 1, count=1),
        "foreign_ids": report(full, ids=foreign, count=len(foreign)),
        "repeated_id": report(full, ids=[own[0], own[0]], count=2),
        "too_many_metrics": report({f"m{i}": 0.0 for i in range(100)}),
        "empty_metric_name": report({"": 0.0}),
        "no_metrics": report({}),
        "only_the_count": report({"count": float(n)}),
        "unknown_metric": report({"bogus": 0.0}),
        "a_subset_of_the_metrics": report({"hr@10": 0.0}),
        "an_extra_metric": report({**full, "bogus": 0.0}),
    }
