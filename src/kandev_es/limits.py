"""Input limits checked at the edge, before anything uses the input: JSON
nesting depth, text that cannot be stored, numbers that are not finite, feed
cursors, UTF-8 in the query string, path lengths. Each failure is a typed 4xx,
never a RecursionError, an OverflowError or a UnicodeEncodeError deeper down."""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from pathlib import Path
from typing import Any

from kandev_es.errors import (
    InvalidCursor,
    InvalidPath,
    InvalidText,
    MalformedJson,
    MalformedQuery,
    RepositoryNotAllowed,
)

MAX_JSON_DEPTH = 64
# Cursors are stored and compared as signed 64-bit integers (SQLite INTEGER,
# PostgreSQL BIGINT); anything larger overflowed inside the driver.
MAX_CURSOR = 2**63 - 1
MAX_LIST_LIMIT = 500  # a task list page (REST, MCP and the CLI's task list)

# A JSON string token (escapes included): its brackets do not nest anything.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
_CURSOR = re.compile(r"[0-9]{1,19}")

# What no text column, file name, argv or environment entry can hold: NUL, and
# lone surrogates (json.loads decodes "\ud800" to one; it has no UTF-8 form).
# A surrogate pair is decoded to its one code point, so any left is lone.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# parse_json_body walks a body only if this matches: without it the body
# decodes to no unstorable string. NUL and a surrogate reach a string only as a
# \u0000 or \uD800-\uDFFF escape, or as the raw bytes: a raw NUL (a UTF-16/32
# body; in UTF-8 the decoder refuses a raw control character in a string) or
# ED A0..BF xx (surrogatepass, as json.loads decodes). An escaped backslash
# before "ud800" also matches: the walk then finds nothing, which is harmless.
_MAYBE_UNSTORABLE = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)|[\xed\x00]")
MAX_FIELD_PATH = 200
# Top-level fields whose own validator already refuses NUL and lone surrogates,
# with a more specific documented error (docs/api.md: External ID rules).
SELF_CHECKED = frozenset({"external_id"})
# Linux's NAME_MAX and PATH_MAX: longer fails with ENAMETOOLONG in any call.
MAX_PATH_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096


def _not_a_number(literal: str) -> float:
    raise MalformedJson(f"{literal} is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise MalformedJson("a number in the request body is beyond the float range")
    return value


# One decoder for every JSON body: NaN and Infinity are not JSON (RFC 8259) and
# 1e400 has no float; both are refused instead of becoming nan/inf.
_DECODER = json.JSONDecoder(parse_constant=_not_a_number, parse_float=_finite)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made = dict(pairs)
    if len(made) == len(pairs):
        return made
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise MalformedJson(
                "a key appears twice in one object of the request body", key=field_path((key,))
            )
        seen.add(key)
    return made  # pragma: no cover - a shorter dict means a repeated key


# The same decoder, refusing an object that names a key twice (which one
# would count is a guess): for bodies where that guess could cost a write.
_UNIQUE_DECODER = json.JSONDecoder(
    parse_constant=_not_a_number, parse_float=_finite, object_pairs_hook=_unique_keys
)


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


def parse_json_body(raw: bytes, unique_keys: bool = False) -> Any:
    """A request body parsed once, at the edge, for every JSON route: depth
    first (the decoder recurses per level), then the strict decode, then every
    string (keys included) checked to be storable text. ``unique_keys``: an
    object naming a key twice is refused (MalformedJson)."""
    check_json_depth(raw)
    decoder = _UNIQUE_DECODER if unique_keys else _DECODER
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        value = decoder.decode(text)
    except (ValueError, UnicodeDecodeError):  # MalformedJson is neither
        raise MalformedJson("request body is not valid JSON") from None
    if _MAYBE_UNSTORABLE.search(raw):  # else no string needs a look
        check_json_text(value)
    return value


def check_json_text(value: Any) -> None:
    """Every string and key in a parsed JSON value (already depth-bounded) is
    storable text and every number finite; walked iteratively, without
    recursion. The error names the first offending field, e.g. ``labels[2]``.
    A top-level ``external_id`` string is left to its own validator, which
    refuses the same characters as ``invalid_external_id`` (control_character,
    invalid_unicode) as docs/api.md's External ID rules say."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    if isinstance(value, dict) and not SELF_CHECKED.isdisjoint(value):
        stack = [(child, (key,)) for key, child in value.items() if key not in SELF_CHECKED]
        for key in value:  # the keys themselves are still checked
            if isinstance(key, str) and _UNSTORABLE.search(key):
                raise _invalid_text((key,), key, in_key=True)
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                raise _invalid_text(path, item)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    raise _invalid_text((*path, key), key, in_key=True)
                stack.append((child, (*path, key)))
        elif isinstance(item, list):
            stack.extend((child, (*path, index)) for index, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise MalformedJson(
                "a number in the request is not finite", field=field_path(path)
            )


def field_path(path: tuple[Any, ...]) -> str:
    """``("labels", 2)`` as ``labels[2]``; printable (unstorable characters
    escaped) and bounded, since it goes back in the error body."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\x00", "\\x00")
    if len(text) > MAX_FIELD_PATH:
        text = text[:MAX_FIELD_PATH] + "..."
    return text or "(body)"


def unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored as text ("nul", "lone_surrogate"), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return "nul" if found.group() == "\x00" else "lone_surrogate"


def _invalid_text(path: tuple[Any, ...], text: str, in_key: bool = False) -> InvalidText:
    reason = unstorable(text)
    where = "a key" if in_key else "a string"
    what = "NUL" if reason == "nul" else "a lone surrogate"
    return InvalidText(
        f"{where} contains {what}, which cannot be stored as text",
        field=field_path(path),
        reason=reason,
    )


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
    check_path_lengths(path)
    resolved = path.resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        raise RepositoryNotAllowed(
            "path is outside the allowed repository roots (KANDEV_REPOSITORY_ROOTS)",
            field="path",
        )
    return resolved


def check_path_lengths(path: Path, field: str = "path") -> None:
    """A path the OS can take at all: no component over 255 bytes, the whole
    under 4096 (422, before any system call fails with ENAMETOOLONG). Its text
    is storable already (parse_json_body)."""
    parts = [len(part.encode("utf-8", "surrogatepass")) for part in path.parts]
    longest = max(parts, default=0)
    if longest > MAX_PATH_COMPONENT_BYTES:
        raise InvalidPath(
            f"a path component is longer than {MAX_PATH_COMPONENT_BYTES} bytes",
            field=field,
            max_component_bytes=MAX_PATH_COMPONENT_BYTES,
        )
    if len(str(path).encode("utf-8", "surrogatepass")) >= MAX_PATH_BYTES:
        raise InvalidPath(
            f"path is longer than {MAX_PATH_BYTES - 1} bytes",
            field=field,
            max_path_bytes=MAX_PATH_BYTES - 1,
        )
