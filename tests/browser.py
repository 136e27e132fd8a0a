"""What the browser tests share: Debian's Chromium (never one Playwright downloads), the skip when it
is missing, where screenshots go, and a page set up to fail on console errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
# Read at import: the autouse settings fixture clears RAGSVC_* from the environment for each test.
ARTIFACTS_ROOT = REPO_ROOT / os.environ.get("RAGSVC_TEST_ARTIFACTS", "test-artifacts")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed at "
                                    "/usr/bin/chromium (apt-get install chromium); the browser test needs it")


def launch(playwright: Any) -> Any:
    """Headless Chromium with nothing reaching out to the network on its own."""
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--no-first-run", "--disable-quic"])


def new_page(browser: Any) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(15_000)
    return page
