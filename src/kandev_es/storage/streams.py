"""What both recorders share: the stream shapes of the create protocol's two
extras (a multi-stream read, a guarded save) and the guard's failure. Kept
apart from the recorders so the SQLite path never imports the PostgreSQL
driver."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from kandev_es.errors import InternalError

Versions = Mapping[uuid.UUID, int]  # (aggregate id -> version the caller read)
Since = Sequence[tuple[uuid.UUID, int]]  # (aggregate id, version already known)


class StreamsAdvanced(InternalError):
    """A stream the guarded save depended on gained events after it was read."""
