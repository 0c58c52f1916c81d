"""The services' default ports on one machine, and the loopback URLs built from them: the one
place they are written (settings, ``fedrec up`` and its options read them from here)."""

from __future__ import annotations

AGGREGATOR_PORT = 8700
RECOMMEND_PORT = 8702
DASHBOARD_PORT = 8704
#: the first client worker's device API; worker ``i`` of ``fedrec up`` listens on this + i
WORKER_HTTP_PORT = 8710

AGGREGATOR_URL = f"http://127.0.0.1:{AGGREGATOR_PORT}"
RECOMMEND_URL = f"http://127.0.0.1:{RECOMMEND_PORT}"
