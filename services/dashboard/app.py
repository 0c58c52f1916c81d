"""The dashboard's app factory: the routes, the page's own static files, the vendored chart
library and Swagger UI (no CDN), bounded bodies and the JSON error answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from services.dashboard.routes import router
from services.dashboard.settings import DashboardSettings
from services.dashboard.upstream import Upstream
from services.error_handlers import install_error_handlers, limit_request_bodies
from services.host_check import HostCheckMiddleware
from services.web_assets import service_app

STATIC_DIR = Path(__file__).resolve().parent / "static"


def create_app(
    settings: DashboardSettings | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Build the dashboard; ``transport`` reaches the upstream services (tests)."""
    settings = settings or DashboardSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.upstream = Upstream(settings, transport)
        try:
            yield
        finally:
            await app.state.upstream.aclose()

    app = service_app("FedRecGEL dashboard", "0.1.0", lifespan)  # /docs without a CDN
    app.state.settings = settings
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    install_error_handlers(app)
    limit_request_bodies(app, settings.max_body_bytes)
    app.include_router(router)
    hint = "name other hosts in FEDREC_DASH_ALLOWED_HOSTS"
    app.add_middleware(HostCheckMiddleware, allowed=settings.allowed_hosts.split(","), hint=hint)
    return app
