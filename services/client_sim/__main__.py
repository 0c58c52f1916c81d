"""``python -m services.client_sim``: run one client-simulation worker."""

from __future__ import annotations

import sys

from services.client_sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
