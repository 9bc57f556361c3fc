"""A real headless Chromium (Debian's ``chromium``) for tests that check what a
person sees: ``--dump-dom`` gives the DOM after the page loaded (styles and
all, under the page's CSP), ``--screenshot`` the pixels.

``find_chromium`` installs the package when it is missing and the tests run as
root (CI does, with the Debian registry reachable); anywhere else the test is
skipped with the reason. Every run gets a fresh profile and a bounded wait.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

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
