"""Aggregator settings, read from the environment with the prefix ``FEDREC_AGG_``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    deadline_poll_s: float = Field(default=1.0, gt=0)
    model_cache_versions: int = Field(default=8, ge=1)
    redis_lock_timeout_s: float = Field(default=60.0, gt=0)
    redis_lock_wait_s: float = Field(default=10.0, ge=0)
    log_level: str = "info"
    # Intra-op threads of torch in the server process (set by ``python -m services.aggregator``).
    # Aggregation is small, memory-bound work: one thread is fastest and never fights the
    # request threads for cores.
    torch_threads: int | None = Field(default=1, ge=1)

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
