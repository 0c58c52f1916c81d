#!/usr/bin/env bash
# The whole test suite: set up, lint, type-check, then pytest.
# Tests that need redis-server or PostgreSQL start their own throw-away servers and skip,
# saying why, when the binaries are absent, as do the dashboard's browser tests without
# Chromium (.ci/run installs all three; scripts/test-without-services.sh checks the skips).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest -q "$@"
