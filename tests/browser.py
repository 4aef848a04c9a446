"""A page opened in real headless Chromium (Debian's `chromium`), driven through the
DevTools protocol (https://chromedevtools.github.io/devtools-protocol/) over its websocket:
what the console said, every request the page made, the DOM after its scripts ran, and a
screenshot (on screen and as printed).

The browser runs with a new empty profile, no network services of its own (no sync, no
component updates, no background networking), and is closed (its process group ended)
when the test is done. Without chromium a test skips, except under CI=true, where it
fails: .ci/run installs it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def chromium() -> str:
    """The browser's executable; a skip (a failure under CI) when it is not installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


@dataclass
class Rendered:
    """What the browser saw of one page."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page's own included
    dom: dict[str, Any] = field(default_factory=dict)  # what `probe` (a JS expression) returned
    screenshot: bytes = b""  # PNG, screen media
    printed: bytes = b""  # PNG, print media (as `window.print()` would lay it out)
    pdf: bytes = b""


class Browser:
    """One headless Chromium and one connection to it (a context manager)."""

    def __init__(self, width: int = 1100, height: int = 900):
        import websocket  # websocket-client, the test extra

        self.profile = tempfile.mkdtemp(prefix="tpubuild-chromium-")
        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        url = self._devtools_url()
        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.width, self.height = width, height

    def _devtools_url(self) -> str:
        deadline = time.monotonic() + 60
        assert self.proc.stderr is not None
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                return found.group(1)
        self.close()
        raise AssertionError("chromium did not start its DevTools server:\n" + "".join(seen[-20:]))

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the browser and its helpers: its own group
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """A command and its result; events that arrive meanwhile are kept."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect the events that arrive within `seconds`."""
        import websocket

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ws.settimeout(left)
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        self.ws.settimeout(60)

    def render(self, page: Path, ready: str, probe: str, timeout: float = 60) -> Rendered:
        """Open `page` (a file), wait until the JS expression `ready` is true, then evaluate
        `probe` (a JS expression returning JSON) and take the screenshots."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable", session)
        self.send("Emulation.setDeviceMetricsOverride", session, width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", session, url=page.resolve().as_uri())
        deadline = time.monotonic() + timeout
        while True:
            state = self.send("Runtime.evaluate", session, expression=f"Boolean({ready})", returnByValue=True)
            if state.get("result", {}).get("value") is True:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{page}: not ready ({ready}) after {timeout} s")
            self.pump(0.1)
        self.pump(0.3)  # anything the page's scripts log right after
        rendered = Rendered()
        value = self.send("Runtime.evaluate", session, expression=f"JSON.stringify({probe})", returnByValue=True)
        rendered.dom = json.loads(value["result"]["value"])
        rendered.screenshot = self._screenshot(session)
        self.send("Emulation.setEmulatedMedia", session, media="print")
        rendered.printed = self._screenshot(session)
        self.send("Emulation.setEmulatedMedia", session, media="")
        rendered.pdf = base64.b64decode(self.send("Page.printToPDF", session)["data"])
        for event in self.events:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                rendered.console_errors.append(details.get("exception", {}).get("description") or details.get("text"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                rendered.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                        for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                rendered.console_errors.append(params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                rendered.requests.append(params["request"]["url"])
        self.events = [e for e in self.events if e.get("sessionId") != session]
        self.send("Target.closeTarget", targetId=target)
        return rendered

    def _screenshot(self, session: str) -> bytes:
        shot = self.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        return base64.b64decode(shot["data"])


def ink(png: bytes) -> tuple[float, int]:
    """(the share of pixels that are not the background's colour, how many colours): a
    blank page is (0, 1)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    background = max(colours)[1] if colours else None
    total = image.width * image.height
    return 1 - (max(colours)[0] / total if colours else 1), len(colours) if background is not None else 0
