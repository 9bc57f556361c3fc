"""The identities read model: which task holds each external ID, and in which
phase. Its unique (workspace_id, external_id) index is byte-exact ("C" /
BINARY) and is what schema attestation inspects."""

from __future__ import annotations

from typing import Any

from kandev_es.projections.base import db_id, event_topics

from kandev_es.domain.identity import Identity
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet


class IdentitiesProjection(TableSet):
    name = "identities"
    tables = ("identities_view",)
    topics = event_topics(Identity)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        table = self.t("identities_view")
        identity = db_id(getattr(event, "originator_id", None), backend)
        if isinstance(event, Identity.Registered):
            if event.external_id is None:
                return  # anonymous identities have no external ID to index
            tx.execute(
                f"INSERT INTO {table} (identity_id, workspace_id, external_id, task_id,"
                " tenure, phase, held) VALUES (?, ?, ?, NULL, 0, 'free', ?)"
                " ON CONFLICT (identity_id) DO NOTHING",
                (identity, db_id(event.workspace_id, backend), event.external_id, False),
            )
        elif isinstance(event, Identity.Claimed):
            tx.execute(
                f"UPDATE {table} SET task_id = ?, tenure = ?, phase = 'preparing',"
                " held = ? WHERE identity_id = ?",
                (db_id(event.task_id, backend), event.tenure, True, identity),
            )
        elif isinstance(event, Identity.Completing | Identity.Completed | Identity.Aborting):
            phase = {
                Identity.Completing: "completing",
                Identity.Completed: "completed",
                Identity.Aborting: "aborting",
            }[type(event)]
            tx.execute(
                f"UPDATE {table} SET phase = ? WHERE identity_id = ? AND tenure = ?",
                (phase, identity, event.tenure),
            )
        elif isinstance(event, Identity.Aborted):
            tx.execute(
                f"UPDATE {table} SET phase = 'aborted', held = ?"
                " WHERE identity_id = ? AND tenure = ?",
                (False, identity, event.tenure),
            )
        elif isinstance(event, Identity.Released):
            tx.execute(
                f"UPDATE {table} SET held = ? WHERE identity_id = ? AND tenure = ?",
                (False, identity, event.tenure),
            )
