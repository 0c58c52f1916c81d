#!/usr/bin/env bash
# Create .venv (if needed) and install the project with its dev tools and Ray (the distributed
# extra: fedrec train --backend ray, whose tests run in CI).
# torch is pinned to 2.13.0 in pyproject.toml so pip takes the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.fedrecgel-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev,distributed]'
  touch "$stamp"
fi
# The simulator's compiled client step (fedrecgel/native): built once per source and CPU into
# ~/.cache/fedrecgel/native; without a C++ compiler the torch code runs instead.
.venv/bin/python -m fedrecgel.native >/dev/null ||
  echo "note: native kernels not built (see above); the client step runs on torch ops" >&2
