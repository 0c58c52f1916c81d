"""Container health probe: exit 0 when ``GET <url>`` answers 2xx, else 1 (stdlib only).

Usage: ``python healthcheck.py [URL]``; without URL, ``$HEALTHCHECK_URL``
(default ``http://127.0.0.1:8700/healthz``). Slim images have no curl, hence this script.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8700/healthz"


def healthy(url: str, timeout_s: float = 4.0) -> bool:
    """Whether ``url`` answers with a 2xx status within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError) as err:
        sys.stderr.write(f"unhealthy: {url}: {err}\n")
        return False


def main(argv: list[str]) -> int:
    """Probe the URL given as the first argument (or the environment's)."""
    url = argv[1] if len(argv) > 1 else os.environ.get("HEALTHCHECK_URL", DEFAULT_URL)
    return 0 if healthy(url) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
