"""Health of the aggregator's dependencies: the database and, when configured, Redis.

Only the database is essential: without Redis rounds still close (the database's guard makes
each close happen once) and versions are still published; only version events stop.
"""

from __future__ import annotations

from services.aggregator.db import Database
from services.aggregator.events import RedisBus
from services.aggregator.schemas import Health, HealthStatus


class HealthCheck:
    """Pings the dependencies on every call (nothing cached)."""

    def __init__(self, db: Database, bus: RedisBus | None) -> None:
        self.db = db
        self.bus = bus

    def check(self) -> Health:
        """Ping the database (and Redis when configured)."""
        try:
            self.db.ping()
            database = "ok"
        except Exception as err:
            database = f"error: {type(err).__name__}"
        redis_state = "disabled"
        if self.bus is not None:
            try:
                self.bus.ping()
                redis_state = "ok"
            except Exception as err:
                redis_state = f"error: {type(err).__name__}"
        status: HealthStatus
        if database != "ok":
            status = "error"
        elif redis_state in ("ok", "disabled"):
            status = "ok"
        else:
            status = "degraded"  # rounds close on the database's guard alone
        return Health(status=status, database=database, redis=redis_state)
