"""A real headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by selenium, for the console's
browser tests; screenshots go to ``tests/artifacts/console/`` (git-ignored)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def chromium_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    problem = chromium_missing()
    if problem:
        if os.environ.get("TXMQ_REQUIRE_BROWSER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> Path:
    """Save a screenshot of the whole page as ``tests/artifacts/console/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 40, 3000)))
    driver.save_screenshot(str(path))
    return path
