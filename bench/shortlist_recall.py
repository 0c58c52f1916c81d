"""Why two-stage recall falls at 1,000,000 items: the candidate stage taken apart, in one run.

    python bench/shortlist_recall.py [--users 12]

On the trained synthetic 1e6-item model (bench/trained_models.py), for a fixed draw of its
users: exact top 10 (the whole catalogue scored), then recall@10 (mean and 5th percentile over
users) of the candidates of

* ``flat``: the exact top-n of the proxy inner product (:mod:`services.recommend_api.shortlist`)
  over every item: what the proxy alone loses;
* ``ivf``: the served index (IVF lists, 8-bit vectors) at several ``nprobe``: what the lists
  lose on top, with the search time per query.

Also what the model is: how many items moved from their initial vectors in training, and how
many principal directions the proxy keeps. Writes bench/results/shortlist_recall.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import trained_models  # noqa: E402

from fedrecgel.model import Scorer, init_shared  # noqa: E402
from services.recommend_api.shortlist import ProxyShortlist, ShortlistConfig  # noqa: E402

OUT = ROOT / "bench" / "results" / "shortlist_recall.json"


def _recall(top: list[set[int]], cands: np.ndarray) -> dict[str, float]:
    r = np.array([len(t & set(c.tolist())) / 10 for t, c in zip(top, cands, strict=True)])
    return {"mean": round(float(r.mean()), 3), "p5": round(float(np.percentile(r, 5)), 3)}


def main() -> None:
    """Measure and write the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = trained_models.load("synthetic-1m")
    cfg, shared, private = d["cfg"], d["shared"], d["private"]
    init = init_shared(cfg, 0)
    moved = (shared["item_gmf"] != init["item_gmf"]).any(1)
    scorer = Scorer(cfg, shared)
    gen = torch.Generator().manual_seed(1)
    rows = torch.randperm(len(private["user_gmf"]), generator=gen)[: args.users]
    users = [{k: v[r : r + 1] for k, v in private.items()} for r in rows.tolist()]
    t0 = time.perf_counter()
    top = [set(torch.topk(scorer.score_all(u)[0], 10).indices.tolist()) for u in users]
    exact_s = (time.perf_counter() - t0) / len(users)
    served = ShortlistConfig()
    sl = ProxyShortlist(scorer, served)
    queries = np.concatenate([sl.query(u) for u in users])
    vectors = torch.from_numpy(sl.vectors(slice(0, cfg.n_items)))
    proxy = torch.from_numpy(queries) @ vectors.T
    del vectors
    out: dict[str, Any] = {
        "command": " ".join(["python bench/shortlist_recall.py", *sys.argv[1:]]),
        "model": {
            "name": "synthetic-1m",
            "rounds": d["rounds"],
            "test_hr@10": d["test"]["hr@10"],
            "items": cfg.n_items,
            "items_moved_from_init": int(moved.sum()),
            "proxy_directions_kept": int(sl.basis.shape[1]),
            "of_directions": int(sl.basis.shape[0]),
            "index": type(sl.index).__name__,
        },
        "users": len(users),
        "exact_s_per_user": round(exact_s, 2),
        "flat": {},
        "ivf": {},
    }
    for n in (300, 1_000, 3_000, 10_000):
        out["flat"][str(n)] = _recall(top, torch.topk(proxy, n).indices.numpy())
    for nprobe in (48, 128, 256):
        sl.index.nprobe = nprobe
        for n in (300, 1_000, 3_000):
            t0 = time.perf_counter()
            _, idx = sl.index.search(queries, n)
            ms = 1000 * (time.perf_counter() - t0) / len(users)
            out["ivf"][f"nprobe{nprobe}_{n}"] = {**_recall(top, idx), "search_ms": round(ms, 1)}
    out["served"] = {"nprobe": served.nprobe, "candidates": served.ivf_candidates}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
