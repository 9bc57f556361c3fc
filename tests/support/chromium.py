"""A real headless Chromium (Debian's ``chromium``) for tests that check what a
person sees: ``--dump-dom`` gives the DOM after the page loaded (styles and
all, under the page's CSP), ``--screenshot`` the pixels.

``Devtools`` drives one over the DevTools protocol (on a pipe, no extra
package) for what happens after load: typing, waiting for results, measuring.

``find_chromium`` installs the package when it is missing and the tests run as
root (CI does, with the Debian registry reachable); anywhere else the test is
skipped with the reason. Every run gets a fresh profile and a bounded wait.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

WAIT_S = 90.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def _installed() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def find_chromium() -> str:
    found = _installed()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            pytest.skip(f"could not install chromium: {' '.join(command)}: {done.stderr[-500:]}")
    found = _installed()
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


class Chromium:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.runs = 0

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        profile = self.workdir / f"chromium-profile-{self.runs}"  # fresh, every run
        done = subprocess.run(
            [self.binary, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, f"chromium failed ({done.returncode}):\n{done.stderr[-3000:]}"
        return done

    def dump_dom(self, url: str) -> str:
        return self._run("--dump-dom", url).stdout

    def screenshot(self, url: str, path: Path, width: int = 1280, height: int = 1500) -> Path:
        self._run(f"--screenshot={path}", f"--window-size={width},{height}", url)
        assert path.is_file(), "chromium wrote no screenshot"
        return path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def png_pixel(path: Path, x: int, y: int) -> tuple[int, int, int]:
    """The RGB colour at (x, y) of an 8-bit RGB or RGBA PNG (Chromium's)."""
    data = path.read_bytes()
    width, _ = png_size(path)
    depth, colour = data[24], data[25]
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format {depth}/{colour}"
    channels = 3 if colour == 2 else 4
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        if kind == b"IDAT":
            chunks.append(data[offset + 8 : offset + 8 + length])
        offset += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    for row in range(y + 1):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + best) & 0xFF
        previous = line
    pixel = previous[x * channels : x * channels + 3]
    return pixel[0], pixel[1], pixel[2]


class Devtools:
    """One headless Chromium driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``: the browser reads commands from fd 3 and writes
    answers to fd 4, NUL-separated JSON), for what a person does after a page
    has loaded: type into a field, wait for results, look at one element. Every
    request a page makes is recorded (``requested``), so a test can check that
    nothing came from another host. Every wait is bounded."""

    def __init__(self, binary: str, workdir: Path, width: int = 1280, height: int = 900) -> None:
        to_browser, self._commands = os.pipe()
        self._answers, from_browser = os.pipe()

        def wire_pipes() -> None:  # in the child: fds 3 and 4 as Chromium expects
            # moved above 4 first, so neither dup2 overwrites the other pipe's end
            reading, writing = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser,
                                                                           from_browser))
            os.dup2(reading, 3)  # dup2 makes them inheritable across exec
            os.dup2(writing, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={workdir / 'chromium-devtools'}",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_pipes, close_fds=False,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.requested: list[str] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(target for target in targets if target["type"] == "page")
        attached = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self.session = attached["sessionId"]
        for domain in ("Page.enable", "Network.enable", "Runtime.enable"):
            self.call(domain, session=self.session)
        self.call("Emulation.setDeviceMetricsOverride", session=self.session, width=width,
                  height=height, deviceScaleFactor=1, mobile=False)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._answers], [], [], 1.0)
            if ready:
                chunk = os.read(self._answers, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        sent: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            sent["sessionId"] = session
        os.write(self._commands, json.dumps(sent).encode() + b"\0")
        deadline = time.monotonic() + WAIT_S
        while True:
            message = self._read_message(deadline)
            if message.get("method") == "Network.requestWillBeSent":
                self.requested.append(message["params"]["request"]["url"])
            if message.get("id") == self._next_id:
                assert "error" not in message, f"{method}: {message['error']}"
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", session=self.session, expression=expression,
                           returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    def wait_for(self, expression: str, seconds: float = 30.0) -> Any:
        """The expression's value once it is truthy (polled every 100 ms)."""
        deadline = time.monotonic() + seconds
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {seconds} s: {expression}")
            time.sleep(0.1)

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=self.session, url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the first element ``selector`` finds."""
        x, y = self.wait_for(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=self.session, type=kind, x=x, y=y,
                      button="left", clickCount=1)

    def type(self, text: str) -> None:
        """Key presses into the focused element, one character at a time."""
        for char in text:
            self.call("Input.dispatchKeyEvent", session=self.session, type="keyDown",
                      key=char, text=char)
            self.call("Input.dispatchKeyEvent", session=self.session, type="keyUp", key=char)

    def screenshot(self, path: Path) -> Path:
        shot = self.call("Page.captureScreenshot", session=self.session, format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._commands)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        os.close(self._answers)
