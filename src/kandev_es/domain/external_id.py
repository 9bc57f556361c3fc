"""External ID validation, in the one order the protocol fixes (docs/api.md: External ID rules).

1. reject ASCII control characters (U+0000-U+001F, U+007F) before trimming,
2. trim Unicode whitespace (Python's ``str.isspace``),
3. empty after trimming means "absent", not an error,
4. at most 255 UTF-8 bytes.

Nothing else is normalised: no case folding, no NFC/NFD, so matching stays
byte-exact.
"""

from __future__ import annotations

import functools
import re
import uuid

from kandev_es.domain.ids import namespace
from kandev_es.errors import InvalidExternalId

MAX_EXTERNAL_ID_BYTES = 255
IDENTITY_NAMESPACE = uuid.UUID("6f6b9c1e-5c7a-4d0e-9a43-2f1d8f6a0b71")
_identity_name_id = namespace(IDENTITY_NAMESPACE)


_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def normalize_external_id(raw: object) -> str | None:
    """Return the canonical external ID, or None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidExternalId("external_id must be a string", reason="not_a_string")
    control = _ASCII_CONTROL.search(raw)
    if control is not None:
        raise InvalidExternalId(
            "external_id contains an ASCII control character",
            reason="control_character",
            position=control.start(),
        )
    trimmed = raw.strip()
    if not trimmed:
        return None
    try:
        encoded = trimmed.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidExternalId(
            "external_id is not valid Unicode text", reason="invalid_unicode"
        ) from None
    if len(encoded) > MAX_EXTERNAL_ID_BYTES:
        raise InvalidExternalId(
            f"external_id is longer than {MAX_EXTERNAL_ID_BYTES} UTF-8 bytes",
            reason="too_long",
            length_bytes=len(encoded),
        )
    return trimmed


def require_external_id(raw: object) -> str:
    """The canonical external ID of a lookup, release or history query, where
    absent (or blank) is an error rather than "create without one"."""
    external_id = normalize_external_id(raw)
    if external_id is None:
        raise InvalidExternalId("external_id query parameter is required", reason="missing")
    return external_id


@functools.lru_cache(maxsize=65536)  # a retry asks again for the same one (SHA-1)
def identity_id(workspace_id: uuid.UUID, external_id: str) -> uuid.UUID:
    """Aggregate id of the identity: the event store's unique (originator_id,
    version) index is then the uniqueness backstop."""
    return _identity_name_id(f"{workspace_id}\x00{external_id}")
