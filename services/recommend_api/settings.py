"""Settings of the recommendation API (environment prefix ``FEDREC_REC_``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.error_handlers import DEFAULT_MAX_JSON_BYTES
from services.ports import AGGREGATOR_URL, RECOMMEND_PORT
from services.recommend_api.ranking import RankingConfig
from services.secret_files import secret_from_file, weak_secret
from services.service_settings import Environment, ServiceSettings
from services.url_settings import MAX_THREADS, HttpUrl, RedisUrl, Threads

_RANKING = RankingConfig()  # the ranking defaults live there once


class Settings(ServiceSettings):
    """Where the model comes from, how items are labelled, and how ranking is done."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_REC_")

    # production unless development is chosen explicitly: a placeholder or short aggregator
    # token is refused outside development
    environment: Environment = "production"
    host: str = "127.0.0.1"
    port: int = Field(default=RECOMMEND_PORT, ge=0, le=65535)
    # None ('none'): follow no aggregator (the holder is fed by the caller, e.g. in tests).
    aggregator_url: HttpUrl | None = AGGREGATOR_URL
    aggregator_token: SecretStr | None = None
    # the token read from a file instead (services/secret_files.py)
    aggregator_token_file: Path | None = None
    redis_url: RedisUrl = None
    versions_channel: str = "fedrec:versions"
    # Seconds between ETag polls of the aggregator when Redis is not configured; with Redis
    # the poll still runs, ``redis_poll_factor`` times slower, to catch missed events.
    poll_interval_s: float = Field(default=2.0, gt=0, le=3600, allow_inf_nan=False)
    redis_poll_factor: float = Field(default=15.0, ge=1, le=1e6, allow_inf_nan=False)
    fetch_timeout_s: float = Field(default=60.0, gt=0, le=86400, allow_inf_nan=False)
    # Item ids: the dataset's own labels in index order (``load_split(...).item_labels``),
    # or a text file with one label per line; item indices as strings when neither is set.
    dataset: str | None = None
    data_dir: Path | None = None
    item_labels: Path | None = None
    # Catalogues larger than this are ranked in two stages: ``ann_shortlist`` candidates from
    # an index, re-scored exactly (services/recommend_api/shortlist.py; the index's shape:
    # fit samples, the share of the item side's variance kept, IVF lists probed). A request asks for exact ranking with "exact".
    # The candidate stage: "auto" (a faiss flat index up to 200,000 items, a per-request scan
    # of the item tables above, re-ranking at least ``ann_scan_candidates``), or one of them.
    ann_threshold: int = Field(default=_RANKING.ann_threshold, ge=0)
    ann_shortlist: int = Field(default=_RANKING.ann_shortlist, ge=1)
    ann_fit_samples: int = Field(default=_RANKING.ann_fit_samples, ge=16)
    ann_variance: float = Field(default=_RANKING.ann_variance, gt=0, le=1)
    ann_nprobe: int = Field(default=_RANKING.ann_nprobe, ge=1)
    ann_index: Literal["auto", "flat", "ivf", "scan"] = _RANKING.ann_index
    ann_scan_candidates: int = Field(default=_RANKING.ann_scan_candidates, ge=1)
    # The longest list one request may ask for (k; above it 422 k_too_large): the callers of
    # this API may rank deep candidate lists; a worker's device API asks for one user's list,
    # at most 1000 items, and passes a k_too_large on when this is set lower.
    max_k: int = Field(default=_RANKING.max_k, ge=1)
    # Scoring thread pool; each scoring call uses ``torch_threads`` intra-op threads.
    workers: Threads = Field(default_factory=lambda: min(os.cpu_count() or 1, MAX_THREADS))
    torch_threads: Threads = 1
    # The largest request body accepted (bytes); a larger one is answered 413 unread.
    max_body_bytes: int = Field(default=DEFAULT_MAX_JSON_BYTES, ge=1024)

    @field_validator("aggregator_url", mode="before")
    @classmethod
    def _none_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() == "none" else value

    @model_validator(mode="after")
    def _read_secret_files(self) -> Settings:
        if (token := secret_from_file(self, "aggregator_token")) is not None:
            self.aggregator_token = SecretStr(token)
        return self

    @model_validator(mode="after")
    def _refuse_weak_token(self) -> Settings:
        """Outside development the aggregator token must be a real secret."""
        if self.environment != "development" and self.aggregator_token is not None:
            why = weak_secret(
                self.aggregator_token.get_secret_value(), "FEDREC_REC_AGGREGATOR_TOKEN"
            )
            if why is not None:
                raise ValueError(f"{why} (FEDREC_REC_ENVIRONMENT={self.environment})")
        return self
