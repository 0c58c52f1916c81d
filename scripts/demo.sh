#!/usr/bin/env bash
# The demo: set up, then `fedrec up` — aggregator, two client workers and the recommendation
# API as local processes (SQLite, no Redis), 20 federated rounds on the bundled FilmTrust data,
# then three users' top-10. Extra arguments go to `fedrec up` (e.g. --keep-running, --rounds 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/fedrec up --rounds 20 --workdir runs/demo "$@"
