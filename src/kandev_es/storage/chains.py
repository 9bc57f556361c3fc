"""The chain hashes a save can know before it writes (docs/auditing.md:
Tamper-evident history), for both recorders to put in their INSERT.

An event's previous hash is the genesis for version 1 or its stream's event
one version earlier; when that event is in the same save its hash is known
here. Otherwise it is a stored row, which only the save's transaction may
read (after the stream's lock): the event gets None and the recorder's
statement fills it (storage/event_sql.py on PostgreSQL, a read in the write
transaction on SQLite). A Created's save (four events, two new streams) and
the bench's are all known here. Same function as the offline verifier's
(kandev_es_client.ledger.chain_hash): one definition of the hash."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from eventsourcing.persistence import StoredEvent
from kandev_es_client.ledger import GENESIS, chain_hash


def known_chain_hashes(stored_events: Sequence[StoredEvent]) -> list[bytes | None]:
    """Each event's chain hash, or None where it needs a stored previous hash."""
    made: dict[tuple[uuid.UUID, int], bytes | None] = {}
    hashes: list[bytes | None] = []
    for event in stored_events:
        key = event.originator_id
        if not isinstance(key, uuid.UUID):
            key = uuid.UUID(str(key))
        version = event.originator_version
        previous = GENESIS if version == 1 else made.get((key, version - 1))
        value = (None if previous is None
                 else chain_hash(key, version, previous, event.topic, event.state))
        made[(key, version)] = value
        hashes.append(value)
    return hashes
