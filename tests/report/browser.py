"""A real headless Chromium driven through its DevTools protocol, and a PNG decoder.

Chromium (Debian's package, ``/usr/bin/chromium``; ``.ci/run`` installs it) is started with
``--remote-debugging-pipe``: DevTools messages are NUL-terminated JSON on file descriptors 3
(to the browser) and 4 (from it), so no port and no websocket library is needed. The page's
console errors, uncaught exceptions and failed loads are collected from ``Runtime`` and
``Log`` events; screenshots are PNGs, decoded here with :mod:`zlib` (no imaging library).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


def chromium_path() -> str | None:
    """The Chromium executable, or ``None`` when it is not installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless browser with one page; ``with Chromium() as browser: ...``."""

    def __init__(self, executable: str, width: int = 1400, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the browser reads fd 3 and writes fd 4
            reader = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            writer = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(reader, 3)  # dup2 leaves them inheritable; Python's own fds are not
            os.dup2(writer, 4)

        self.process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            close_fds=False,
            preexec_fn=child_fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    # -- the protocol ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        decoded: dict[str, Any] = json.loads(message)
        return decoded

    def call(
        self, method: str, *, session: bool = False, timeout: float = 60.0, **params: Any
    ) -> dict[str, Any]:
        """Send a command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self._send(message)
        while True:
            answer = self._receive(timeout)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for an event of the page (one that came already counts)."""
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._receive(timeout)
            if "method" in message:
                self.events.append(message)
                if message["method"] == method:
                    return message

    # -- what a test uses -----------------------------------------------------------------

    def open(self, url: str, settle_s: float = 2.0) -> None:
        """Navigate and wait for the load event, then let scripts settle (forgets the
        events of the page before)."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")
        time.sleep(settle_s)
        self.evaluate("1")  # drain the events that came meanwhile

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page reported."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(
                    "console: " + " ".join(str(a.get("value", a)) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('exception', {}).get('description')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                found.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url')}")
        return found

    def screenshot(self, path: Path) -> np.ndarray:
        """Capture the whole page as a PNG at ``path``; return its pixels (h, w, 3)."""
        result = self.call(
            "Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True
        )
        data = base64.b64decode(result["data"])
        path.write_bytes(data)
        return decode_png(data)

    def close(self) -> None:
        """Close the browser and remove its profile."""
        try:
            self._send({"id": self._next_id + 1, "method": "Browser.close", "params": {}})
            self.process.wait(timeout=10)
        except Exception:
            self.process.kill()
            self.process.wait(timeout=10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def decode_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG to an (h, w, 3) uint8 array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and color in (2, 6), (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8)
    stride = width * channels
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if kind == 0:
            current = line
        elif kind == 1:  # Sub: a running sum per channel
            current = (np.cumsum(line.reshape(width, channels), axis=0) % 256).reshape(-1)
        elif kind == 2:  # Up
            current = (line + previous) % 256
        else:  # Average or Paeth: each byte needs the one decoded before it
            current = _unfilter_sequential(int(kind), line.tolist(), previous.tolist(), channels)
        out[y] = current
        previous = np.asarray(current, dtype=np.int32)
    return out.reshape(height, width, channels)[:, :, :3]


def _unfilter_sequential(kind: int, line: list[int], up: list[int], bpp: int) -> np.ndarray:
    result = [0] * len(line)
    for i, value in enumerate(line):
        left = result[i - bpp] if i >= bpp else 0
        above = up[i]
        if kind == 3:
            result[i] = (value + (left + above) // 2) & 0xFF
            continue
        corner = up[i - bpp] if i >= bpp else 0
        estimate = left + above - corner
        pa, pb, pc = abs(estimate - left), abs(estimate - above), abs(estimate - corner)
        predictor = left if pa <= pb and pa <= pc else above if pb <= pc else corner
        result[i] = (value + predictor) & 0xFF
    return np.asarray(result, dtype=np.int32)
