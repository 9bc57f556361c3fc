"""The identities read model: which task holds each external ID, and in which
phase. Its unique (workspace_id, external_id) index is byte-exact ("C" /
BINARY) and is what schema attestation inspects.

Applied a batch at a time (read the batch's rows once, advance them in memory,
upsert them back), so rebuilds stay fast."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from kandev_es.projections.base import db_id, event_topics

from kandev_es.domain.identity import Identity
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet

_CHUNK = 500
_PHASES: dict[type, str] = {
    Identity.Completing: "completing",
    Identity.Completed: "completed",
    Identity.Aborting: "aborting",
    Identity.Aborted: "aborted",
}


class IdentitiesProjection(TableSet):
    name = "identities"
    inline = True  # written in each save (projections/inline.py); replayed by rebuilds
    tables = ("identities_view",)
    topics = event_topics(Identity)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        self.apply_batch(tx, [(event, position)], backend)

    def apply_batch(self, tx: Transaction, items: Sequence[tuple[Any, int]], backend: str) -> None:
        events = [e for e, _ in items if isinstance(e, Identity.Event)]
        wanted = {e.originator_id for e in events if not isinstance(e, Identity.Registered)}
        rows = self._load(tx, wanted, backend)
        changed: set[uuid.UUID] = set()
        for event in events:
            key = event.originator_id
            if isinstance(event, Identity.Registered):
                if event.external_id is not None:  # anonymous identities are not indexed
                    rows[key] = {
                        "workspace_id": event.workspace_id, "external_id": event.external_id,
                        "task_id": None, "tenure": 0, "phase": "free", "held": False,
                    }  # fmt: skip
                    changed.add(key)
                continue
            row = rows.get(key)
            if row is None:
                continue
            changed.add(key)
            if isinstance(event, Identity.Claimed):
                row.update(task_id=event.task_id, tenure=event.tenure, phase="preparing")
                row["held"] = True
            elif row["tenure"] != getattr(event, "tenure", None):
                continue  # a released tenure finishing after a newer claim (AC-7)
            elif type(event) in _PHASES:
                row["phase"] = _PHASES[type(event)]
                if isinstance(event, Identity.Aborted):
                    row["held"] = False
            elif isinstance(event, Identity.Released):
                row["held"] = False
        self._write(tx, {k: rows[k] for k in changed}, backend)

    def _load(
        self, tx: Transaction, ids: set[uuid.UUID], backend: str
    ) -> dict[uuid.UUID, dict[str, Any]]:
        keys = list(ids)
        found: dict[uuid.UUID, dict[str, Any]] = {}
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            marks = ", ".join("?" for _ in chunk)
            for row in tx.execute(
                f"SELECT identity_id, workspace_id, external_id, task_id, tenure, phase, held"
                f" FROM {self.t('identities_view')} WHERE identity_id IN ({marks})",
                [db_id(k, backend) for k in chunk],
            ):
                found[uuid.UUID(str(row[0]))] = {
                    "workspace_id": row[1], "external_id": row[2], "task_id": row[3],
                    "tenure": row[4], "phase": row[5], "held": bool(row[6]),
                }  # fmt: skip
        return found

    def _write(self, tx: Transaction, rows: dict[uuid.UUID, dict[str, Any]], backend: str) -> None:
        if not rows:
            return
        tx.executemany(
            f"INSERT INTO {self.t('identities_view')} (identity_id, workspace_id, external_id,"
            " task_id, tenure, phase, held) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (identity_id) DO UPDATE SET task_id = excluded.task_id,"
            " tenure = excluded.tenure, phase = excluded.phase, held = excluded.held",
            [
                (
                    db_id(key, backend),
                    db_id(uuid.UUID(str(row["workspace_id"])), backend),
                    row["external_id"],
                    db_id(uuid.UUID(str(row["task_id"])), backend) if row["task_id"] else None,
                    row["tenure"],
                    row["phase"],
                    row["held"],
                )
                for key, row in rows.items()
            ],
        )
