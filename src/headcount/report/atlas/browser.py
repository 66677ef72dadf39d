"""Open an atlas page in headless Chromium: for the browser test, the size benchmark and the
screenshots in docs/figures. Needs the `dev` extra (selenium) and the system's chromium and
chromedriver (Debian: `apt-get install chromium chromium-driver`); both are given to selenium by
path, so its driver manager downloads nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> tuple[str, str] | None:
    """(browser, chromedriver) paths, or None where either is missing."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(width: int = 1500, height: int = 1000):
    """A selenium webdriver on headless Chromium (no sandbox: CI runs as root)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise RuntimeError("no chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    browser, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def open_page(driver, path: str | Path, query: str = "", timeout: float = 30) -> float:
    """Load the page from file:// and wait until its script has drawn it; returns the seconds from
    the start of navigation to the end of the page's first drawing (the load time)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(path).resolve().as_uri() + query)
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    return driver.execute_script("return window.atlasReadyAt") / 1000.0
