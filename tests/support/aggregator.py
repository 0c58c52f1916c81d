"""The aggregator helpers under the names the tests import them by; they live in
:mod:`harness.aggregator`, which the benchmarks import too."""

from __future__ import annotations

from harness.aggregator import (
    ENROLMENT_SECRET,
    OPERATOR_TOKEN,
    TEST_POPULATION,
    AggregatorFactory,
    FakeClock,
    FederatedDriver,
    bearer,
    current_cohort,
    enrol_headers,
    make_settings,
    operator_headers,
    post_run,
    post_updates,
    random_update,
    register,
    report_sums,
    run_config_for,
    service_of,
    sqlite_url,
    upload_headers,
)

__all__ = [
    "ENROLMENT_SECRET",
    "OPERATOR_TOKEN",
    "TEST_POPULATION",
    "AggregatorFactory",
    "FakeClock",
    "FederatedDriver",
    "bearer",
    "current_cohort",
    "enrol_headers",
    "make_settings",
    "operator_headers",
    "post_run",
    "post_updates",
    "random_update",
    "register",
    "report_sums",
    "run_config_for",
    "service_of",
    "sqlite_url",
    "upload_headers",
]
