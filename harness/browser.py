"""The browser of the dashboard's browser tests: the system's Chromium driven by Playwright
(never a downloaded browser). :func:`chromium` skips the test, saying why, when either is
missing; ``.ci/run`` installs Debian's ``chromium``."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

#: the viewports the page is drawn in
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}

#: the browsers tried, in order (FEDREC_CHROMIUM names another)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """The system Chromium's executable, or None."""
    named = os.environ.get("FEDREC_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


#: why a browser test is skipped on a machine without Playwright or without Chromium
PLAYWRIGHT_MISSING = "Playwright for Python is not installed (pip install playwright)"
CHROMIUM_MISSING = "no Chromium on this machine (Debian: apt-get install chromium)"


def browser_missing() -> str | None:
    """Why no browser test can run here (Playwright or Chromium missing), or None."""
    if importlib.util.find_spec("playwright") is None:
        return PLAYWRIGHT_MISSING
    return CHROMIUM_MISSING if chromium_path() is None else None


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium (a Playwright ``Browser``); skips without one."""
    missing = browser_missing()
    if missing is not None:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    assert path is not None
    args = ["--disable-dev-shm-usage"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()
