"""``python -m services.client_sim``: run one client-simulation worker."""

from __future__ import annotations

import sys

from services.client_sim.cli import main
from services.heap import freeze_startup_heap

if __name__ == "__main__":
    freeze_startup_heap()  # torch's, SQLAlchemy's, ... objects: out of the full GC passes
    sys.exit(main())
