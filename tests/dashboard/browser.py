"""The browser of the dashboard's browser tests: the system's Chromium driven by Playwright
(never a downloaded browser). :func:`chromium` skips the test, saying why, when either is
missing; ``.ci/run`` installs Debian's ``chromium``."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

#: the browsers tried, in order (FEDREC_CHROMIUM names another)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """The system Chromium's executable, or None."""
    named = os.environ.get("FEDREC_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium (a Playwright ``Browser``); skips without one."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium)")
    args = ["--disable-dev-shm-usage"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()
