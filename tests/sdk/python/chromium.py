"""Debian's Chromium, headless, started by Playwright the one way the test scripts share: no
sandbox (tests run as root), and no background traffic (the network is closed)."""

import os

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright):
    path = os.environ.get("CORVID_CHROMIUM", "/usr/bin/chromium")
    return playwright.chromium.launch(executable_path=path, args=ARGS)
