"""The services' `--help` names each option's environment variable and the setting's default,
taken from the settings themselves (the aggregator, recommend_api and dashboard showed no
default at all, and most options no help)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel

from services.aggregator.settings import Settings as AggregatorSettings
from services.dashboard.settings import DashboardSettings
from services.recommend_api.settings import Settings as RecommendSettings


@pytest.mark.parametrize(
    ("module", "settings", "prefix", "fields"),
    [
        ("services.aggregator", AggregatorSettings, "FEDREC_AGG_", ["host", "port"]),
        (
            "services.recommend_api",
            RecommendSettings,
            "FEDREC_REC_",
            ["host", "port", "aggregator_url", "poll_interval_s", "ann_threshold"],
        ),
        (
            "services.dashboard",
            DashboardSettings,
            "FEDREC_DASH_",
            ["host", "port", "aggregator_url", "recommend_url", "poll_interval_s"],
        ),
    ],
)
def test_help_names_the_variable_and_the_settings_default(
    module: str, settings: type[BaseModel], prefix: str, fields: list[str]
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    ).stdout
    shown = " ".join(out.split())
    for field in fields:
        default = settings.model_fields[field].default
        assert f"({prefix}{field.upper()}; default {default})" in shown, (field, shown)


@pytest.mark.parametrize("command", ["aggregator", "recommend", "dashboard", "worker"])
def test_fedrec_service_help_names_the_fedrec_command(command: str) -> None:
    """`fedrec aggregator --help` showed `Usage: python -m services.aggregator`."""
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(f"Usage: fedrec {command} "), out[:200]
