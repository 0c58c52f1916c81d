"""Why two-stage recall falls at 1,000,000 items: the candidate stage taken apart, in one run.

    python -m bench.shortlist_recall [--users 30]

On the trained synthetic 1e6-item model (bench/trained_models.py), for a fixed draw of its
users: exact top 10 (the whole catalogue scored), then recall@10 (mean and 5th percentile over
users) of the candidates of

* ``flat``: the exact top-n of the ``[b, |b|]`` proxy inner product
  (:class:`services.recommend_api.shortlist.ProxyShortlist`) over every item: what that proxy
  alone loses;
* ``ivf``: that proxy in an IVF index (lists, 8-bit vectors) at several ``nprobe``: what the
  lists lose on top, with the search time per query;
* ``scan``: the per-request scan of the item tables with the first-layer proxy
  (:class:`services.recommend_api.shortlist.ScanShortlist`), the top-n of every item.

Then the whole two-stage request (candidates plus exact re-rank, ``ModelHolder.recommend``,
one thread) with the IVF index at its served setting and with the scan, in the same run, and
the parts of one scan request. Also what the model is: how many items moved from their
initial vectors in training, and how many principal directions the ``[b, |b|]`` proxy keeps.
Writes bench/results/shortlist_recall.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench import trained_models
from bench.bench_cli import opt
from fedrecgel.model import Scorer, init_shared
from services.recommend_api.ranking import ModelHolder, RankingConfig, Snapshot
from services.recommend_api.shortlist import ProxyShortlist, ScanShortlist

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "shortlist_recall.json"


def _recall(top: list[set[int]], cands: Any) -> dict[str, float]:
    r = np.array([len(t & set(c.tolist())) / 10 for t, c in zip(top, cands, strict=True)])
    return {"mean": round(float(r.mean()), 3), "p5": round(float(np.percentile(r, 5)), 3)}


def _request_ms(holder: ModelHolder, users: list[dict[str, torch.Tensor]]) -> float:
    """Mean time of one two-stage request (k=10) over ``users``, after one warm-up."""
    bodies = [{k: v[0].tolist() for k, v in u.items()} for u in users]
    holder.recommend(bodies[0]["user_gmf"], bodies[0]["user_mlp"], 10)
    t0 = time.perf_counter()
    for b in bodies:
        holder.recommend(b["user_gmf"], b["user_mlp"], 10)
    return round(1000 * (time.perf_counter() - t0) / len(bodies), 1)


def main(n_users: Annotated[int, opt(None, "--users")] = 30) -> None:
    """Measure and write the JSON."""
    torch.set_num_threads(1)
    d = trained_models.load("synthetic-1m")
    cfg, shared, private = d["cfg"], d["shared"], d["private"]
    init = init_shared(cfg, 0)
    moved = (shared["item_gmf"] != init["item_gmf"]).any(1)
    del init
    scorer = Scorer(cfg, shared)
    gen = torch.Generator().manual_seed(1)
    rows = torch.randperm(len(private["user_gmf"]), generator=gen)[:n_users]
    users = [{k: v[r : r + 1] for k, v in private.items()} for r in rows.tolist()]
    t0 = time.perf_counter()
    top = [set(torch.topk(scorer.score_all(u)[0], 10).indices.tolist()) for u in users]
    exact_s = (time.perf_counter() - t0) / len(users)
    served = RankingConfig()
    ivf_cfg = replace(served.shortlist_config(), index="ivf")
    sl = ProxyShortlist(scorer, ivf_cfg)
    queries = np.concatenate([sl.query(u) for u in users])
    vectors = torch.from_numpy(sl.vectors(slice(0, cfg.n_items)))
    proxy = torch.from_numpy(queries) @ vectors.T
    del vectors
    out: dict[str, Any] = {
        "command": " ".join(["python -m bench.shortlist_recall", *sys.argv[1:]]),
        "model": {
            "name": "synthetic-1m",
            "rounds": d["rounds"],
            "test_hr@10": d["test"]["hr@10"],
            "items": cfg.n_items,
            "items_moved_from_init": int(moved.sum()),
            "proxy_directions_kept": int(sl.basis.shape[1]),
            "of_directions": int(sl.basis.shape[0]),
        },
        "users": len(users),
        "exact_s_per_user": round(exact_s, 2),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 1),
        "flat": {},
        "ivf": {},
        "scan": {},
    }
    sizes = (300, 1_000, 3_000, 10_000, 30_000)
    for n in sizes:
        out["flat"][str(n)] = _recall(top, torch.topk(proxy, n).indices.numpy())
    del proxy
    for nprobe in (48, 128, 256):
        sl.index.nprobe = nprobe
        for n in (300, 1_000, 3_000):
            t0 = time.perf_counter()
            _, idx = sl.index.search(queries, n)
            ms = 1000 * (time.perf_counter() - t0) / len(users)
            out["ivf"][f"nprobe{nprobe}_{n}"] = {**_recall(top, idx), "search_ms": round(ms, 1)}
    sl.index.nprobe = ivf_cfg.nprobe
    scan = ScanShortlist(scorer, served.shortlist_config())
    scan_scores = [scan.scores(u) for u in users]
    for n in sizes:
        out["scan"][str(n)] = _recall(top, [torch.topk(p, n).indices for p in scan_scores])
    del scan_scores
    # the whole request, one thread, both candidate stages in this run
    holder = ModelHolder(RankingConfig(ann_threshold=0))
    snaps = {}
    for kind, stage in (("ivf", sl), ("scan", scan)):
        snaps[kind] = Snapshot(1, scorer, None, None, stage)
    timing: dict[str, Any] = {}
    for _rep in range(2):
        for kind in ("ivf", "scan"):
            holder.swap(snaps[kind])
            timing.setdefault(kind, []).append(_request_ms(holder, users[:10]))
    u = users[0]
    parts: dict[str, float] = {}
    t0 = time.perf_counter()
    scan.fit(u)
    parts["fit_ms"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = scan.scores(u)
    parts["fit_and_scan_ms"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cand = torch.from_numpy(
        np.argpartition(p.numpy(), -served.ann_scan_candidates)[-served.ann_scan_candidates :]
    )
    parts["top_n_ms"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scorer.score(u, cand[None, :])
    parts["rerank_ms"] = time.perf_counter() - t0
    out["request_ms_one_thread"] = {
        "ivf": {
            "ms": timing["ivf"],
            "nprobe": ivf_cfg.nprobe,
            "candidates": ivf_cfg.ivf_candidates,
        },
        "scan": {"ms": timing["scan"], "candidates": served.ann_scan_candidates},
        "scan_parts": {k: round(1000 * v, 1) for k, v in parts.items()},
    }
    out["served"] = {
        "index": served.ann_index,
        "at_1e6": served.shortlist_config().kind_for(cfg.n_items),
        "scan_candidates": served.ann_scan_candidates,
        "fit_samples": len(scan.fit_first) if scan.fit_first is not None else 0,
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
