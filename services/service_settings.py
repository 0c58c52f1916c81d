"""What every service's settings share (the aggregator's, the workers', the recommendation
API's and the dashboard's)."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

#: production unless chosen otherwise: every secret is then checked for strength
Environment = Literal["development", "test", "production"]


class ServiceSettings(BaseSettings):
    """Settings read from ``<env_prefix><NAME>`` environment values (each service's class
    names its prefix in its own ``model_config``, merged with this one); unknown names are
    ignored, and a refused value is never echoed in the error (it may be a secret)."""

    model_config = SettingsConfigDict(extra="ignore", hide_input_in_errors=True)
