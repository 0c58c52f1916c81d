"""Serving snapshots of model versions, their atomic hot swap, and top-K ranking.

A snapshot ranks by the served score ``logit + w * log(1 + n)`` when the aggregator publishes a
popularity prior that applies (:mod:`services.recommend_api.prior`), by the logit alone
otherwise. The prior is attached when a version is built (the candidate index built once, with
its column) and swapped in anew when the prior changes (:meth:`ModelHolder.set_prior`), the
model itself never decoded again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from fedrecgel.config import MAX_ITEMS
from fedrecgel.model import ModelConfig, Scorer
from fedrecgel.wire import WireError, decode_model
from services.recommend_api.errors import (
    InvalidRequest,
    InvalidUserVector,
    KTooLarge,
    ModelLoadError,
    NoModel,
    UnknownItems,
)
from services.recommend_api.prior import PublishedPrior, ServedPrior, fit_prior
from services.recommend_api.shortlist import Shortlist, ShortlistConfig, build_shortlist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankingConfig:
    """How snapshots rank: a candidate index above ``ann_threshold`` items, the number of
    candidates re-ranked exactly, the index's shape (:class:`ShortlistConfig`), limits."""

    ann_threshold: int = 5_000
    ann_shortlist: int = 300
    ann_fit_samples: int = ShortlistConfig.fit_samples
    ann_variance: float = ShortlistConfig.variance
    ann_nprobe: int = ShortlistConfig.nprobe
    ann_index: Literal["auto", "flat", "ivf", "scan"] = ShortlistConfig.index
    ann_scan_candidates: int = ShortlistConfig.scan_candidates
    max_k: int = 10_000

    def shortlist_config(self) -> ShortlistConfig:
        """The candidate index's shape."""
        return ShortlistConfig(
            fit_samples=self.ann_fit_samples,
            variance=self.ann_variance,
            nprobe=self.ann_nprobe,
            index=self.ann_index,
            scan_candidates=self.ann_scan_candidates,
        )


@dataclass(frozen=True)
class Snapshot:
    """One immutable serving state: a model version, its scorer, item labels and index, and
    the popularity prior it ranks with (``prior``; None: the model alone)."""

    version: int
    scorer: Scorer
    labels: Sequence[str] | None  # None: an item's id is its index
    label_index: dict[str, int] | None
    shortlist: Shortlist | None = None
    etag: str | None = None
    prior: ServedPrior | None = None
    # the published prior this snapshot was fitted to (None: none published); by identity
    prior_source: PublishedPrior | None = None
    prior_note: str = "no prior fitted"  # what it does with the prior, and why

    def __post_init__(self) -> None:
        if self.prior is not None:
            if self.prior.bias.shape != (self.n_items,):
                raise ValueError(f"a prior of {len(self.prior.bias)} items for {self.n_items}")
            if self.shortlist is not None and self.shortlist.log_prior is not self.prior.log_prior:
                raise ValueError("the candidate index does not hold the served prior")

    @property
    def prior_weight(self) -> float | None:
        """The prior's weight in the served scores (None: the model alone)."""
        return None if self.prior is None else self.prior.weight

    @property
    def n_items(self) -> int:
        """Catalogue size."""
        return self.scorer.cfg.n_items

    def label(self, i: int) -> str:
        """The item id of catalogue index ``i``."""
        return str(i) if self.labels is None else self.labels[i]

    def index_of(self, item: str) -> int | None:
        """The catalogue index of item id ``item`` (None if unknown)."""
        if self.label_index is not None:
            return self.label_index.get(item)
        if item.isascii() and item.isdigit() and (item == "0" or item[0] != "0"):
            i = int(item)
            return i if i < self.n_items else None
        return None


@dataclass(frozen=True)
class Ranked:
    """A ranking answer: the version that produced it and (item id, score) pairs, best first."""

    version: int
    items: list[tuple[str, float]] = field(default_factory=list)
    prior_weight: float | None = None  # the popularity prior in the scores (None: none)


#: the longest item label read from a labels file
MAX_LABEL_CHARS = 1000


def read_labels_file(path: Path) -> list[str]:
    """Item labels from a text file, one per line, in item index order; ValueError (naming the
    file) for a line over :data:`MAX_LABEL_CHARS` or more lines than a catalogue holds (an
    endless or binary file is never read whole)."""
    labels: list[str] = []
    try:
        with Path(path).open(encoding="utf-8") as fh:
            while line := fh.readline(MAX_LABEL_CHARS + 2):
                label = line.rstrip("\r\n")
                if len(label) > MAX_LABEL_CHARS:
                    raise ValueError(
                        f"{path}, line {len(labels) + 1}: over {MAX_LABEL_CHARS} characters"
                    )
                if len(labels) == MAX_ITEMS:
                    raise ValueError(f"{path}: more than {MAX_ITEMS} item labels")
                labels.append(label)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    while labels and labels[-1] == "":
        labels.pop()
    return labels


def dataset_labels(dataset: str, data_dir: Path | None) -> list[str]:
    """The dataset's own item ids in index order, as strings."""
    from fedrecgel.data import load_split

    return [str(x) for x in load_split(dataset, data_dir).item_labels.tolist()]


class ModelHolder:
    """Holds the current :class:`Snapshot`; a swap is one reference assignment.

    Readers take ``holder.snapshot`` once per request and use only that object, so a request
    never mixes two versions and never waits for a load.
    """

    def __init__(self, config: RankingConfig | None = None, labels: Sequence[str] | None = None):
        self.config = config or RankingConfig()
        self.labels = list(labels) if labels is not None else None
        self._snapshot: Snapshot | None = None
        self._swap_lock = threading.Lock()  # orders writers only; readers never lock
        self.swaps = 0
        self.swap_failures = 0
        self._published: PublishedPrior | None = None  # the prior new versions are built with
        self._prior_note: str | None = None
        self.prior_swaps = 0

    @property
    def snapshot(self) -> Snapshot | None:
        """The snapshot serving now (None before the first load)."""
        return self._snapshot

    @property
    def version(self) -> int | None:
        """The version serving now."""
        snap = self._snapshot
        return None if snap is None else snap.version

    @property
    def published_prior(self) -> PublishedPrior | None:
        """The prior the aggregator published last (None: none)."""
        return self._published

    @property
    def prior_weight(self) -> float | None:
        """The prior's weight in the served scores now (None: the model alone)."""
        snap = self._snapshot
        return None if snap is None else snap.prior_weight

    @property
    def prior_note(self) -> str | None:
        """What the serving snapshot does with the published prior, and why (None: none yet)."""
        snap = self._snapshot
        return None if snap is None else snap.prior_note

    # ------------------------------------------------------------------ loading

    def build(
        self,
        cfg: ModelConfig,
        shared: dict[str, Tensor],
        version: int,
        etag: str | None = None,
        owned: bool = False,
    ) -> Snapshot:
        """A snapshot of one version: scorer (item half precomputed), labels, optional index.

        ``owned``: ``shared`` is this call's to consume (freshly decoded): the item MLP table
        is overwritten in place by its first-layer half, so a large model is never held twice.
        """
        for name, t in shared.items():
            if not _all_finite(t):
                raise ModelLoadError(f"model version {version}: {name} has NaN or Inf")
        labels: Sequence[str] | None = None
        label_index: dict[str, int] | None = None
        if self.labels is not None:
            if len(self.labels) != cfg.n_items:
                raise ModelLoadError(
                    f"model version {version} has {cfg.n_items} items but "
                    f"{len(self.labels)} item labels are configured"
                )
            labels = self.labels
            label_index = {lab: i for i, lab in enumerate(labels)}
        tensors = {k: v.float().contiguous() for k, v in shared.items()}
        # ranking reads the item MLP table only through its precomputed first-layer half
        # (Scorer.item_first): dropping it saves a quarter of a large model's memory
        item_mlp = tensors.pop("item_mlp", None)
        item_first = None
        if item_mlp is not None:
            in_place = owned and item_mlp.data_ptr() == shared["item_mlp"].data_ptr()
            item_first = _first_layer_items(cfg, item_mlp, tensors["tower.0.weight"], in_place)
        del item_mlp
        scorer = Scorer(cfg, tensors, item_first)
        published = self._published
        fit = fit_prior(published, cfg.n_items)
        shortlist = None
        if cfg.n_items > self.config.ann_threshold:
            # built here, before the snapshot exists: a request sees a snapshot only after
            # swap(), with its index complete (and the prior's column, if its counts apply)
            shortlist = build_shortlist(scorer, self.config.shortlist_config(), fit.log_prior)
        return Snapshot(
            version, scorer, labels, label_index, shortlist, etag, fit.served, published, fit.note
        )

    def with_prior(self, snap: Snapshot, published: PublishedPrior | None) -> Snapshot:
        """``snap``'s model ranked with ``published`` (as far as it applies): the same scorer
        and labels; the candidate index rebuilt only when the prior's counts changed."""
        fit = fit_prior(published, snap.n_items)
        shortlist = snap.shortlist
        if shortlist is not None:
            shortlist = shortlist.with_log_prior(fit.log_prior)
        return replace(
            snap, shortlist=shortlist, prior=fit.served, prior_source=published, prior_note=fit.note
        )

    def set_prior(self, published: PublishedPrior | None) -> bool:
        """Rank with ``published`` from now on: new versions are built with it, and the serving
        snapshot is swapped for one with it unless it has it already; True when swapped.

        A version swapped in meanwhile (built with the prior before) is fitted again, so the
        prior swapped in is always the newest published one's. When fitting fails (the error
        is raised) the serving snapshot and the prior new versions are built with stay as they
        were."""
        while True:
            snap = self._snapshot
            if snap is None or snap.prior_source is published:
                self._published = published
                return False
            new = self.with_prior(snap, published)  # may rebuild an index: outside the lock
            with self._swap_lock:
                if self._snapshot is not snap:
                    continue  # another version came in: fit that one
                self._snapshot = new
                self._published = published
                self.prior_swaps += 1
            self._note_prior(new)
            return True

    def build_from_bytes(self, data: bytes, etag: str | None = None) -> Snapshot:
        """Decode a safetensors model blob (``fedrecgel.wire.encode_model``) into a snapshot."""
        try:
            cfg, shared, version = decode_model(data)
        except WireError as err:
            raise ModelLoadError(str(err)) from err
        return self.build(cfg, shared, version, etag, owned=True)

    def swap(self, snapshot: Snapshot) -> None:
        """Serve ``snapshot`` from now on (atomic: one reference assignment)."""
        with self._swap_lock:
            old = self._snapshot
            self._snapshot = snapshot
            self.swaps += 1
        log.info(
            "serving model version %d (%d items, %s%s) after %s",
            snapshot.version,
            snapshot.n_items,
            "index shortlist" if snapshot.shortlist is not None else "exact",
            "" if snapshot.prior is None else f", prior weight {snapshot.prior.weight:g}",
            "nothing" if old is None else f"version {old.version}",
        )
        self._note_prior(snapshot)

    def _note_prior(self, snap: Snapshot) -> None:
        """Log what ``snap`` does with its prior when that differs from before (once, at info:
        every version of a run without a prior would otherwise say it again)."""
        note = snap.prior_note
        if note != self._prior_note:
            self._prior_note = note
            log.info("popularity prior: %s", note)

    def record_failure(self, what: str, err: BaseException) -> None:
        """Count and log a failed load; the current snapshot keeps serving."""
        with self._swap_lock:
            self.swap_failures += 1
        log.error("could not load %s (%s); still serving version %s", what, err, self.version)

    def load_bytes(self, data: bytes, etag: str | None = None) -> bool:
        """Build and swap in a model blob; on failure keep the old snapshot and return False."""
        try:
            snap = self.build_from_bytes(data, etag)
        except Exception as err:  # any failure must leave the old model serving
            self.record_failure("a new model version", err)
            return False
        self.swap(snap)
        return True

    # ------------------------------------------------------------------ ranking

    def recommend(
        self,
        user_gmf: Sequence[float],
        user_mlp: Sequence[float] | None,
        k: int,
        exclude: Sequence[str] = (),
        exact: bool = False,
    ) -> Ranked:
        """Top-``k`` items for one user vector with the current snapshot (``exact``: score the
        whole catalogue instead of re-ranking the index's candidates)."""
        snap = self._snapshot  # one read: the whole request uses this version
        if snap is None:
            raise NoModel("no model version is loaded yet")
        if k <= 0:
            raise InvalidRequest(f"k must be positive, got {k}")
        if k > self.config.max_k:
            raise KTooLarge(f"k must be at most {self.config.max_k}, got {k}")
        private = user_tensors(snap.scorer.cfg, user_gmf, user_mlp)
        excluded = resolve_items(snap, exclude)
        shortlist = 0 if exact else self.config.ann_shortlist
        idx, scores = top_k(snap, private, k, excluded, shortlist)
        return Ranked(
            snap.version,
            [(snap.label(i), float(s)) for i, s in zip(idx.tolist(), scores.tolist(), strict=True)],
            snap.prior_weight,
        )


_ROWS = 65_536  # item rows per step of the load-time passes over the tables


def _all_finite(t: Tensor) -> bool:
    """No NaN or Inf in ``t``, checked in row chunks (no full-size temporary)."""
    if t.dim() == 0 or len(t) <= _ROWS:
        return bool(torch.isfinite(t).all())
    return all(bool(torch.isfinite(t[i : i + _ROWS]).all()) for i in range(0, len(t), _ROWS))


@torch.no_grad()
def _first_layer_items(cfg: ModelConfig, item_mlp: Tensor, w0: Tensor, in_place: bool) -> Tensor:
    """``item_mlp @ W0_item^T`` (:attr:`Scorer.item_first`), in row chunks; with ``in_place``
    written over ``item_mlp`` itself (the two have the same shape, (I, E) with H = E)."""
    w = w0[:, cfg.mlp_dim :].T  # (E, H)
    if not in_place or w.shape[0] != w.shape[1]:
        return item_mlp @ w
    for i in range(0, len(item_mlp), _ROWS):
        rows = item_mlp[i : i + _ROWS]
        rows.copy_(rows @ w)
    return item_mlp


def user_tensors(
    cfg: ModelConfig, user_gmf: Sequence[float], user_mlp: Sequence[float] | None
) -> dict[str, Tensor]:
    """Check the user vector against the model shape and return it as (1, d) tensors."""
    dims = cfg.private_dims()
    given: dict[str, Sequence[float] | None] = {"user_gmf": user_gmf, "user_mlp": user_mlp}
    out: dict[str, Tensor] = {}
    for name, vec in given.items():
        if name not in dims:
            if vec:
                raise InvalidUserVector(f"model kind {cfg.kind!r} takes no {name}")
            continue
        if vec is None:
            raise InvalidUserVector(f"{name} is required ({dims[name]} floats)")
        if len(vec) != dims[name]:
            raise InvalidUserVector(f"{name} has length {len(vec)}, the model wants {dims[name]}")
        t = torch.tensor(vec, dtype=torch.float32)
        if not bool(torch.isfinite(t).all()):
            raise InvalidUserVector(
                f"{name} contains NaN or Inf, or a value beyond the float32 range (+-3.4e38)"
            )
        out[name] = t[None, :]
    return out


def resolve_items(snap: Snapshot, items: Sequence[str]) -> Tensor:
    """Catalogue indices of item ids; every unknown id is named in the error."""
    idx: list[int] = []
    unknown: list[str] = []
    for item in items:
        i = snap.index_of(item)
        if i is None:
            unknown.append(item)
        else:
            idx.append(i)
    if unknown:
        shown = ", ".join(repr(u if len(u) <= 40 else u[:40] + "...") for u in unknown[:20])
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise UnknownItems(f"unknown item ids in exclude: {shown}{more}")
    return torch.tensor(sorted(set(idx)), dtype=torch.int64)


@torch.no_grad()
def top_k(
    snap: Snapshot, private: dict[str, Tensor], k: int, excluded: Tensor, shortlist: int
) -> tuple[Tensor, Tensor]:
    """(indices, served scores) of the best ``k`` non-excluded items, best first: the logit,
    plus the snapshot's prior bias ``w * log(1 + n)`` when it has one (one add over the rows
    scored).

    Exact over the whole catalogue unless the snapshot has an index, ``shortlist`` > 0 and
    the request fits in the shortlist; then the index's candidates (recalled with the prior's
    term too) are re-scored with the exact model.
    """
    n_left = snap.n_items - len(excluded)
    k = min(k, n_left)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64), torch.empty(0)
    index, prior = snap.shortlist, snap.prior
    want = max(shortlist, 4 * k, index.min_candidates if index is not None else 0) + len(excluded)
    if index is not None and shortlist > 0 and want < snap.n_items // 2:
        cand = index.search(private, want, prior)
        if len(excluded):
            cand = cand[~torch.isin(cand, excluded)]
        if len(cand) >= k:
            scores = snap.scorer.score(private, cand[None, :])[0]
            if prior is not None:
                scores = scores + prior.bias[cand]
            _check_finite(scores)
            best = torch.topk(scores, k)
            return cand[best.indices], best.values
    scores = snap.scorer.score_all(private)[0]
    if prior is not None:
        scores.add_(prior.bias)
    _check_finite(scores)
    if len(excluded):
        scores[excluded] = -math.inf
    best = torch.topk(scores, k)
    return best.indices, best.values


def _check_finite(scores: Tensor) -> None:
    """Refuse a user vector whose scores overflow (e.g. values near the float32 limit): a
    ranking of Inf and NaN means nothing, and JSON has no number for them."""
    if not bool(torch.isfinite(scores).all()):
        raise InvalidUserVector(
            "the user vector gives scores that are not finite numbers (its values are too large)"
        )
