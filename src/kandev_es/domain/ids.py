"""UUIDs as ``uuid.uuid5`` and ``uuid.uuid4`` make them, in less CPU: a
create derives two name-based ones (its identity's id, its feed entry's) and
draws two random ones (its task's id, its owner's).

``uuid.uuid5`` re-reads the namespace's bytes, and both build the UUID
through ``UUID.__init__``'s argument checks; here the namespace's bytes are
taken once and the UUID is set from its integer directly (the fields
``UUID`` has: ``int`` and ``is_safe``). tests/unit/test_ids.py compares them."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable

# The version and RFC 4122 variant bits, as UUID.__init__ sets them.
_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_SET = (5 << 76) | (0x8000 << 48)
_SET_RANDOM = (4 << 76) | (0x8000 << 48)
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def namespace(space: uuid.UUID) -> Callable[[str], uuid.UUID]:
    """``lambda name: uuid.uuid5(space, name)``, made faster."""
    prefix = space.bytes

    def name_id(name: str) -> uuid.UUID:
        digest = hashlib.sha1(prefix + name.encode("utf-8"), usedforsecurity=False).digest()
        made = object.__new__(uuid.UUID)
        _set(made, "int", (int.from_bytes(digest[:16]) & _CLEAR) | _SET)
        _set(made, "is_safe", _UNKNOWN)
        return made

    return name_id


def random_id() -> uuid.UUID:
    """``uuid.uuid4()``: 16 random bytes, version 4."""
    made = object.__new__(uuid.UUID)
    _set(made, "int", (int.from_bytes(os.urandom(16)) & _CLEAR) | _SET_RANDOM)
    _set(made, "is_safe", _UNKNOWN)
    return made
