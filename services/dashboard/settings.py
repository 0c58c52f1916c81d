"""Settings of the dashboard (environment prefix ``FEDREC_DASH_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.error_handlers import DEFAULT_MAX_JSON_BYTES
from services.ports import AGGREGATOR_URL, DASHBOARD_PORT, RECOMMEND_URL
from services.secret_files import secret_from_file, weak_secret
from services.service_settings import Environment, ServiceSettings
from services.url_settings import HttpUrl, LogLevel, check_http_url


class DashboardSettings(ServiceSettings):
    """Where the dashboard reads from, and with which credentials.

    ``aggregator_token`` is the aggregator's *reader* token (the run's state, configuration
    and deadline are not public); ``worker_token`` is the workers' device token, needed when
    they listen beyond loopback. The operator token is never a setting: the person at the
    browser types it, and it travels with each operator action only.
    """

    model_config = SettingsConfigDict(env_prefix="FEDREC_DASH_")

    environment: Environment = "production"
    host: str = "127.0.0.1"
    port: int = Field(default=DASHBOARD_PORT, ge=0, le=65535)
    aggregator_url: HttpUrl = AGGREGATOR_URL
    aggregator_token: SecretStr | None = None
    aggregator_token_file: Path | None = None
    # None: no recommendation-API panel
    recommend_url: HttpUrl | None = RECOMMEND_URL
    # the device APIs of the workers, comma-separated, in shard order (user u is on u % n)
    worker_urls: str = ""
    worker_token: SecretStr | None = None
    worker_token_file: Path | None = None
    # how often the page asks for fresh data (seconds); unchanged data costs a 304
    poll_interval_s: float = Field(default=2.0, gt=0, le=3600)
    timeout_s: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)
    max_body_bytes: int = Field(default=DEFAULT_MAX_JSON_BYTES, ge=1024)
    log_level: LogLevel = "info"
    # Host names the page is served under besides 127.0.0.1, localhost and [::1]
    # (comma-separated; "*": any): a page elsewhere that points its own name at this machine
    # (DNS rebinding) is refused (services/host_check.py)
    allowed_hosts: str = ""

    @field_validator("recommend_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() in ("", "none") else value

    @field_validator("worker_urls")
    @classmethod
    def _worker_urls_are_http(cls, value: str) -> str:
        if not value.strip():
            return value
        for shard, url in enumerate(value.split(",")):
            if not url.strip():  # skipping it would give every later worker the wrong shard
                raise ValueError(
                    f"entry {shard} is empty: the list is in shard order, one URL per shard"
                )
            check_http_url(url.strip())
        return value

    @property
    def workers(self) -> list[str]:
        """The workers' base URLs, shard 0 first."""
        return [u.strip().rstrip("/") for u in self.worker_urls.split(",") if u.strip()]

    @model_validator(mode="after")
    def _read_secret_files(self) -> DashboardSettings:
        for name in ("aggregator_token", "worker_token"):
            if (token := secret_from_file(self, name)) is not None:
                setattr(self, name, SecretStr(token))
            value = getattr(self, name)
            if self.environment != "development" and value is not None:
                why = weak_secret(value.get_secret_value(), f"FEDREC_DASH_{name.upper()}")
                if why is not None:
                    raise ValueError(f"{why} (FEDREC_DASH_ENVIRONMENT={self.environment})")
        return self
