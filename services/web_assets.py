"""Browser assets every service serves itself: the Swagger UI of ``/docs`` (and the dashboard's
chart library) come from ``services/static/vendor``, never from a CDN, so the pages work offline
and in an air-gapped cluster.

:func:`install_local_docs` replaces FastAPI's default ``/docs`` (which loads its script and
style sheet from a CDN) by the same page with local URLs, and turns ReDoc (``/redoc``, also a
CDN script) off. The vendored files and their licences are listed in
``services/static/vendor/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from services.head_requests import HeadAsGetMiddleware

#: the vendored files (chart.js, swagger-ui-dist)
VENDOR_DIR = Path(__file__).resolve().parent / "static" / "vendor"
#: where every service serves them
VENDOR_URL = "/static/vendor"
SWAGGER_JS = f"{VENDOR_URL}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{VENDOR_URL}/swagger-ui/swagger-ui.css"
SWAGGER_FAVICON = f"{VENDOR_URL}/swagger-ui/favicon-32x32.png"
CHART_JS = f"{VENDOR_URL}/chartjs/chart.umd.min.js"


def mount_vendor(app: FastAPI) -> None:
    """Serve the vendored files under :data:`VENDOR_URL` (once per app)."""
    if not any(getattr(r, "path", None) == VENDOR_URL for r in app.routes):
        app.mount(VENDOR_URL, StaticFiles(directory=VENDOR_DIR), name="vendor")


def install_local_docs(app: FastAPI) -> None:
    """``/docs`` with the Swagger UI served by ``app`` itself. Build the app with
    ``docs_url=None, redoc_url=None``; the OpenAPI document stays at ``app.openapi_url``."""
    mount_vendor(app)
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=SWAGGER_JS,
            swagger_css_url=SWAGGER_CSS,
            swagger_favicon_url=SWAGGER_FAVICON,
        )


def service_app(
    title: str,
    version: str,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
) -> FastAPI:
    """A service's app: ``/docs`` served by the app itself (:func:`install_local_docs`), no
    ReDoc; HEAD answered for every GET route (:class:`HeadAsGetMiddleware`, added here first so
    that it is the innermost middleware)."""
    app = FastAPI(title=title, version=version, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(HeadAsGetMiddleware)
    install_local_docs(app)
    return app
