"""The Python client where the server is installed: ``from kandev_es.client import
Client`` is ``from kandev_es_client import Client``. The one copy of its code is the
small ``kandev-es-client`` distribution in clients/python (httpx only, no server),
which ``pip install kandev-es`` installs too."""

from __future__ import annotations

from kandev_es_client import (
    RETRY_STATUSES,
    BatchItem,
    Client,
    ClientError,
    Creation,
    DeadlineExceeded,
    Event,
    Outcome,
    __version__,
)

__all__ = [
    "RETRY_STATUSES",
    "BatchItem",
    "Client",
    "ClientError",
    "Creation",
    "DeadlineExceeded",
    "Event",
    "Outcome",
    "__version__",
]
