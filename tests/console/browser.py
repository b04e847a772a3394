"""Headless Chromium for the console's tests and the bench: Debian's chromium and chromium-driver driven by selenium,
with flags that work on these machines (no sandbox as root, nothing fetched from the network), a fresh profile."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
LAUNCH_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000")


def browser_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


class Browser:
    """One Chromium with its own profile directory (removed by `quit`)."""

    def __init__(self, profile_parent: Path | None = None) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=profile_parent))
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in LAUNCH_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        self.driver.set_page_load_timeout(30)

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
