"""Headless Chromium driven through the DevTools protocol over ``--remote-debugging-pipe``
(NUL-separated JSON on file descriptors 3 and 4), which needs nothing beyond the standard library:
the browser the report tests open report.html in (no tests here)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)
DEADLINE_S = 60.0
LOCAL_SCHEMES = ("file:", "data:")

if CHROMIUM is None and os.environ.get("DPLEDGER_REQUIRE_CHROMIUM"):
    raise RuntimeError("DPLEDGER_REQUIRE_CHROMIUM is set but chromium is not installed")


class DevTools:
    """A minimal DevTools-protocol client over the pipe Chromium opens with
    --remote-debugging-pipe."""

    def __init__(self, user_data_dir: Path) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        # in the child: its fd 3 reads our commands, its fd 4 writes replies
        def wire_pipes() -> None:
            high_read = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD_CLOEXEC, 10)
            high_write = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(high_read, 3)  # dup2 leaves the copies at 3 and 4 inheritable
            os.dup2(high_write, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # keep fds 3 and 4; every other Python fd is non-inheritable anyway
            preexec_fn=wire_pipes,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._deadline = time.monotonic() + DEADLINE_S

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its reply; a protocol error fails the test."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while self._next_id not in self._replies:
            self._read()
        reply = self._replies.pop(self._next_id)
        assert "error" not in reply, f"{method} failed: {reply['error']}"
        return reply.get("result", {})

    def wait_for(self, method: str, session: str) -> dict[str, Any]:
        """Block until the event ``method`` arrives for ``session``."""
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self._read()

    def _read(self) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0 or not select.select([self._from_browser], [], [], remaining)[0]:
            raise TimeoutError("chromium did not answer within the deadline")
        chunk = os.read(self._from_browser, 1 << 20)
        if not chunk:
            raise ConnectionError("chromium closed the DevTools pipe")
        self._buffer += chunk
        *messages, self._buffer = self._buffer.split(b"\0")
        for raw in messages:
            message = json.loads(raw)
            if "id" in message:
                self._replies[message["id"]] = message
            else:
                self.events.append(message)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, ConnectionError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


PAGE_FACTS = """JSON.stringify({
  images: Array.from(document.images).map(
    i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth})),
  resources: performance.getEntriesByType('resource').map(e => e.name),
  firstBlock: (document.querySelector('main > h1 + *') || {}).className || '',
  firstText: ((document.querySelector('main > h1 + *') || {}).innerText || '').slice(0, 200),
  height: document.documentElement.scrollHeight
})"""


def open_page(
    html: Path, user_data_dir: Path, width: int = 1280
) -> tuple[dict[str, Any], list[str], list[dict], bytes]:
    """Load ``html``; return (page facts, URLs the page requested, console/log entries, full-page
    screenshot PNG)."""
    browser = DevTools(user_data_dir)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Network", "Log", "Runtime"):
            browser.call(f"{domain}.enable", session=session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        browser.call("Page.navigate", {"url": html.resolve().as_uri()}, session)
        browser.wait_for("Page.loadEventFired", session)
        evaluated = browser.call(
            "Runtime.evaluate", {"expression": PAGE_FACTS, "returnByValue": True}, session
        )
        facts = json.loads(evaluated["result"]["value"])
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": width,
                "height": int(facts["height"]),
                "deviceScaleFactor": 1,
                "mobile": False,
            },
            session,
        )
        shot = base64.b64decode(
            browser.call("Page.captureScreenshot", {"format": "png"}, session)["data"]
        )
        requested = [
            e["params"]["request"]["url"]
            for e in browser.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session
        ]
        logs = [
            e["params"]
            for e in browser.events
            if e.get("method") in ("Log.entryAdded", "Runtime.exceptionThrown")
        ]
        return facts, requested, logs, shot
    finally:
        browser.close()
