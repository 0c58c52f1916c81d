#!/usr/bin/env bash
# The demo: set up, then `fedrec up` — aggregator, two client workers and the recommendation
# API as local processes (SQLite, no Redis), 300 federated rounds on the bundled FilmTrust data
# (the default preset's, each worker uploading one partial sum a round, the model evaluated
# every 10 rounds), then three users' top-10. Extra arguments go to `fedrec up` and override
# these (e.g. --keep-running, --rounds 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/fedrec up --rounds 300 --eval-every 10 --upload-grouping worker \
  --workdir runs/demo "$@"
