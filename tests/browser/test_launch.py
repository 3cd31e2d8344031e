"""benchmarks/launch.py's Chromium: its --disable-features keeps every feature Playwright disables itself
(Chromium keeps only the last --disable-features it is given), and no window builds the address bar's
popups."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from benchmarks.launch import CHROMIUM, CHROMIUM_ARGS, HIDDEN_UI_FEATURES, PLAYWRIGHT_DISABLED_FEATURES


def _browser_process_args(marker: str) -> list[str]:
    """The command line of the browser process (not a renderer or a helper) started with `marker`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended while we looked
            continue
        if marker in args and not any(arg.startswith("--type=") for arg in args):
            return args
    raise AssertionError(f"no browser process started with {marker}")


def test_our_disabled_features_keep_playwrights(browser: Any) -> None:
    # A browser started without our --disable-features shows Playwright's own on its command line.
    marker = f"--headscope-probe={uuid.uuid4().hex}"  # Chromium ignores a switch it does not know
    ours = [arg for arg in CHROMIUM_ARGS if not arg.startswith("--disable-features=")]
    probe = browser.browser_type.launch(executable_path=str(CHROMIUM), args=[*ours, marker])
    try:
        args = _browser_process_args(marker)
    finally:
        probe.close()
    theirs = [arg.split("=", 1)[1].split(",") for arg in args if arg.startswith("--disable-features=")]
    assert theirs, "Playwright passed no --disable-features"
    missing = set(theirs[0]) - set(PLAYWRIGHT_DISABLED_FEATURES)
    assert not missing, f"add {sorted(missing)} to PLAYWRIGHT_DISABLED_FEATURES in benchmarks/launch.py"


def test_no_window_builds_the_address_bars_popups(browser: Any) -> None:
    context = browser.new_context()
    try:
        context.new_page().goto("about:blank")
        targets = browser.new_browser_cdp_session().send("Target.getTargets")["targetInfos"]
    finally:
        context.close()
    popups = [target["url"] for target in targets if target["url"].startswith("chrome://omnibox-popup")]
    assert popups == [], f"Chromium builds {popups}: {HIDDEN_UI_FEATURES} no longer hide them"
