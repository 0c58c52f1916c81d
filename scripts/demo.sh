#!/usr/bin/env bash
# The demo: set up, then train FedRecGEL on the FilmTrust data that ships with the project.
# Extra arguments go to `fedrec train` (e.g. --rounds 20 --seeds 0,1,2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/fedrec train --dataset filmtrust --out runs/demo "$@"
