"""Creations in flight: one row per unsettled tenure with its lease, so the
recovery Runtime can find expired ones without scanning every stream. The
event store stays the truth: the Runtime re-reads each candidate."""

from __future__ import annotations

from typing import Any

from kandev_es.projections.base import db_id, event_topics

from kandev_es.domain.identity import Identity
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet


class CreationsProjection(TableSet):
    name = "creations"
    tables = ("creations_view",)
    topics = event_topics(Identity)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        identity = db_id(getattr(event, "originator_id", None), backend)
        if isinstance(event, Identity.Registered):
            return
        if isinstance(event, Identity.Claimed):
            tx.execute(
                f"INSERT INTO {self.t('creations_view')} (identity_id, tenure, workspace_id,"
                " task_id, phase, epoch, lease_expires_at) VALUES (?, ?, ?, ?, 'preparing', 0, ?)"
                " ON CONFLICT (identity_id, tenure) DO NOTHING",
                (
                    identity,
                    event.tenure,
                    db_id(event.plan.get("workspace_id"), backend),
                    db_id(event.task_id, backend),
                    event.lease_expires_at.timestamp(),
                ),
            )
        elif isinstance(event, Identity.StepRecorded) and event.lease_expires_at is not None:
            self._update(
                tx,
                identity,
                event.tenure,
                "lease_expires_at = ?",
                event.lease_expires_at.timestamp(),
            )
        elif isinstance(event, Identity.RecoveryClaimed):
            tx.execute(
                f"UPDATE {self.t('creations_view')} SET epoch = ?, lease_expires_at = ?"
                " WHERE identity_id = ? AND tenure = ?",
                (event.epoch, event.lease_expires_at.timestamp(), identity, event.tenure),
            )
        elif isinstance(event, Identity.Completing):
            self._update(tx, identity, event.tenure, "phase = ?", "completing")
        elif isinstance(event, Identity.Aborting):
            self._update(tx, identity, event.tenure, "phase = ?", "aborting")
        elif isinstance(event, Identity.Completed | Identity.Aborted):
            tx.execute(
                f"DELETE FROM {self.t('creations_view')} WHERE identity_id = ? AND tenure = ?",
                (identity, event.tenure),
            )

    def _update(
        self, tx: Transaction, identity: Any, tenure: int, assignment: str, value: Any
    ) -> None:
        # ``assignment`` is one of the fixed column clauses above, never input.
        tx.execute(
            f"UPDATE {self.t('creations_view')} SET {assignment}"
            " WHERE identity_id = ? AND tenure = ?",
            (value, identity, tenure),
        )
