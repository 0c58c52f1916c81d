#!/usr/bin/env bash
# The README's promise that `bash scripts/test.sh` passes on a bare machine, checked on any
# machine: the tests that need redis-server, PostgreSQL, Chromium or haproxy (pytest markers
# redis, postgres, browser, haproxy; tests/conftest.py marks every test that uses the first
# two's fixtures) run with those binaries hidden, and each must be skipped saying which one is missing (none may pass,
# fail or error; at least one must be collected); then the benchmark command-line tests, whose
# programs need Redis (the last bare-machine failure), must pass. Needs .venv
# (scripts/bootstrap.sh); .ci/run runs it before the whole suite. Takes well under a minute.
#
# Hidden: PATH is replaced by a folder of links to everything on it but the names below, and
# FEDREC_PG_BINDIR is set empty (harness/postgres.py: no PostgreSQL, where the tests
# would otherwise find Debian's /usr/lib/postgresql/*/bin); FEDREC_CHROMIUM is unset.
set -euo pipefail
cd "$(dirname "$0")/.."
bare=$(mktemp -d)
trap 'rm -rf "$bare"' EXIT
mkdir "$bare/bin"
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  [ -d "$dir" ] || continue
  for exe in "$dir"/*; do
    name=${exe##*/}
    case "$name" in
      redis-server | redis-cli | redis-sentinel | initdb | pg_ctl | pg_ctlcluster | postgres | \
        postmaster | chromium | chromium-browser | google-chrome | google-chrome-stable | chrome | \
        haproxy)
        continue ;;
    esac
    if [ -f "$exe" ] && [ -x "$exe" ] && [ ! -e "$bare/bin/$name" ]; then
      ln -s "$exe" "$bare/bin/$name"
    fi
  done
done
run_bare() {
  env -u FEDREC_CHROMIUM PATH="$bare/bin" FEDREC_PG_BINDIR= "$@"
}
for binary in redis-server initdb pg_ctl chromium haproxy; do
  if run_bare bash -c "command -v $binary" >/dev/null; then
    echo "test-without-services: $binary is still on the bare PATH" >&2
    exit 1
  fi
done

status=0
run_bare .venv/bin/pytest -q -rs -p no:cacheprovider -m "redis or postgres or browser or haproxy" \
  --junitxml "$bare/skips.xml" tests || status=$?
if [ "$status" -ne 0 ]; then
  echo "test-without-services: pytest exit $status (5: no test collected)" >&2
  exit 1
fi
.venv/bin/python - "$bare/skips.xml" <<'EOF'
"""Every selected test was skipped, for a binary it needs that is missing."""
import sys
import xml.etree.ElementTree as ET

from harness.browser import CHROMIUM_MISSING, PLAYWRIGHT_MISSING
from harness.haproxy import HAPROXY_MISSING
from harness.loopback import REDIS_MISSING
from harness.postgres import POSTGRES_MISSING

REASONS = (REDIS_MISSING, POSTGRES_MISSING, CHROMIUM_MISSING, PLAYWRIGHT_MISSING, HAPROXY_MISSING)
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
wrong = []
n = 0
for case in cases:
    n += 1
    name = f"{case.get('classname')}::{case.get('name')}"
    skipped = case.find("skipped")
    message = "" if skipped is None else skipped.get("message", "")
    if not any(reason in message for reason in REASONS):
        wrong.append(f"{name}: not skipped for a missing binary ({message or 'it ran'})")
if n == 0 or wrong:
    print("test-without-services: " + ("no test collected" if n == 0 else "\n".join(wrong)))
    sys.exit(1)
print(f"test-without-services: {n} tests skipped, each for a missing binary")
EOF
run_bare .venv/bin/pytest -q -p no:cacheprovider tests/test_bench_cli.py
