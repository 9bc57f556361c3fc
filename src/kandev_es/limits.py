"""Input limits checked before anything parses or uses the input: JSON nesting
depth, feed cursors and UTF-8 in the query string. Each failure is a typed 400,
never a RecursionError or an OverflowError deeper down."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from kandev_es.errors import InvalidCursor, MalformedJson, MalformedQuery, RepositoryNotAllowed

MAX_JSON_DEPTH = 64
# Cursors are stored and compared as signed 64-bit integers (SQLite INTEGER,
# PostgreSQL BIGINT); anything larger overflowed inside the driver.
MAX_CURSOR = 2**63 - 1

# A JSON string token (escapes included): its brackets do not nest anything.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
_CURSOR = re.compile(r"[0-9]{1,19}")


def check_json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse a body nested deeper than ``limit`` without recursion. Cheap on
    ordinary bodies: with no more brackets than the limit nothing is scanned."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        if bracket.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise MalformedJson(
                    f"request body is nested deeper than {limit} levels", max_depth=limit
                )
        else:
            depth -= 1


def stored_integer(text: str) -> int | None:
    """``text`` as a value the store can hold (ASCII digits, 0..2^63-1: a feed
    cursor, a revision), or None."""
    if not _CURSOR.fullmatch(text) or int(text) > MAX_CURSOR:
        return None
    return int(text)


def parse_cursor(raw: str | None, what: str = "after") -> int:
    """A feed or list cursor (``stored_integer``); absent or blank is 0."""
    if raw is None or raw.strip() == "":
        return 0
    value = stored_integer(raw.strip())
    if value is None:
        raise InvalidCursor(f"{what} must be an integer between 0 and {MAX_CURSOR}", field=what)
    return value


def parse_bounded(raw: str | None, what: str, default: float, low: float, high: float) -> float:
    """A numeric query parameter (page size, stream seconds) within ``low..high``."""
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidCursor(f"{what} must be a number", field=what) from None
    if not low <= value <= high:  # also refuses nan and inf
        raise InvalidCursor(f"{what} must be between {low:g} and {high:g}", field=what)
    return value


def check_query_string(raw: bytes) -> None:
    """The query string must decode as UTF-8 once percent-decoded: otherwise the
    framework would silently substitute U+FFFD and a lookup would ask for an
    external ID nobody sent."""
    try:
        urllib.parse.unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedQuery("query string is not valid UTF-8") from None


def check_repository_path(path: Path, roots: tuple[Path, ...]) -> Path:
    """Least privilege: creations touch only repositories under the operator's
    roots (already resolved), judged after symlinks and ``..`` resolve. Checked
    at registration and again at each create, so narrowing the roots also
    covers repositories registered before."""
    resolved = path.resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        raise RepositoryNotAllowed(
            "path is outside the allowed repository roots (KANDEV_REPOSITORY_ROOTS)",
            field="path",
        )
    return resolved
