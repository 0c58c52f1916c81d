"""Aggregator settings, read from the environment with the prefix ``FEDREC_AGG_``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from services.secret_files import secret_from_file

PLACEHOLDER_TOKEN = "changethis"


class Settings(BaseSettings):
    """Everything the aggregator needs to start; nothing connects when this is built."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_AGG_", extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    database_url: str = "sqlite:///./aggregator.db"
    redis_url: str | None = None
    operator_token: str = PLACEHOLDER_TOKEN
    # Optional read-only credential for services that only download models (recommend_api).
    reader_token: str | None = None
    # The same secrets read from files (services/secret_files.py), and the database password
    # put into ``database_url`` from a file (the URL then names no password).
    operator_token_file: Path | None = None
    reader_token_file: Path | None = None
    database_password_file: Path | None = None
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    deadline_poll_s: float = Field(default=1.0, gt=0)
    model_cache_versions: int = Field(default=8, ge=1)
    # Retention of model versions: the newest ``keep_latest_versions`` and every version that
    # is a multiple of ``keep_every_versions`` (0: none besides the newest) keep their params;
    # the others are pruned when a round closes (reading one answers 410). Only the newest
    # version keeps its server-optimizer state: it is all a resumed run needs.
    keep_latest_versions: int = Field(default=5, ge=1)
    keep_every_versions: int = Field(default=10, ge=0)
    # Least seconds between two compactions (space freed by pruning handed back to the
    # file system: SQLite incremental vacuum + WAL truncation, PostgreSQL VACUUM), run by the
    # background task after a round closed, never on a request.
    compact_interval_s: float = Field(default=30.0, ge=0)
    redis_lock_timeout_s: float = Field(default=60.0, gt=0)
    redis_lock_wait_s: float = Field(default=10.0, ge=0)
    log_level: str = "info"
    # Intra-op threads of torch in the server process (set by ``python -m services.aggregator``).
    # Aggregation is small, memory-bound work: one thread is fastest and never fights the
    # request threads for cores.
    torch_threads: int | None = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _read_secret_files(self) -> Settings:
        """Secrets given as ``*_FILE`` paths are read before they are checked."""
        if (token := secret_from_file(self, "operator_token")) is not None:
            self.operator_token = token
        if (token := secret_from_file(self, "reader_token")) is not None:
            self.reader_token = token
        if (password := secret_from_file(self, "database_password")) is not None:
            url = make_url(self.database_url).set(password=password)
            self.database_url = url.render_as_string(hide_password=False)
        return self

    @model_validator(mode="after")
    def _refuse_placeholder_secret(self) -> Settings:
        """The placeholder operator token is only acceptable in development."""
        if self.environment != "development" and self.operator_token == PLACEHOLDER_TOKEN:
            raise ValueError(
                "FEDREC_AGG_OPERATOR_TOKEN must be set to a real secret outside development"
            )
        if not self.operator_token:
            raise ValueError("FEDREC_AGG_OPERATOR_TOKEN must not be empty")
        return self
