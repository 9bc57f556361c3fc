"""Creations in flight: one row per unsettled tenure with its lease, so the
recovery Runtime can find expired ones without scanning every stream. The
event store stays the truth: the Runtime re-reads each candidate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kandev_es.projections.base import db_id, event_topics

from kandev_es.domain.identity import Identity
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet


class CreationsProjection(TableSet):
    name = "creations"
    inline = True  # written in each save (projections/inline.py); replayed by rebuilds
    tables = ("creations_view",)
    topics = event_topics(Identity)

    def apply_batch(self, tx: Transaction, items: Sequence[tuple[Any, int]], backend: str) -> None:
        """As ``apply`` one event after another, in fewer statements: a row
        whose tenure ends (Completed or Aborted) later in the batch is only
        deleted, its earlier inserts and updates skipped (it ends absent
        either way), and the deletions go in one ``executemany`` before the
        batch's other statements. Rows of different (identity, tenure) never
        touch each other, and a tenure's events after its last end in the
        batch still run after its deletion, in order. A create that claims and
        completes within one batch (every Created) so costs no statement of
        its own but one deletion row, instead of three to five statements."""
        ends: dict[tuple[Any, Any], int] = {}
        for index, (event, _) in enumerate(items):
            if isinstance(event, Identity.Completed | Identity.Aborted):
                ends[(event.originator_id, event.tenure)] = index
        if ends:
            tx.executemany(
                self._delete_tenure_sql(),
                [(db_id(identity, backend), tenure) for identity, tenure in ends],
            )
        for index, (event, position) in enumerate(items):
            end = ends.get((getattr(event, "originator_id", None), getattr(event, "tenure", None)))
            if end is None or index > end:
                self.apply(tx, event, position, backend)

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
        elif isinstance(event, Identity.StepRecorded | Identity.LeaseRenewed):
            if event.lease_expires_at is not None:  # a step record without a renewal
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
                self._delete_tenure_sql(),
                (identity, event.tenure),
            )

    def _delete_tenure_sql(self) -> str:
        """A settled tenure leaves the view (one event at a time and in a batch)."""
        return f"DELETE FROM {self.t('creations_view')} WHERE identity_id = ? AND tenure = ?"

    def _update(
        self, tx: Transaction, identity: Any, tenure: int, assignment: str, value: Any
    ) -> None:
        # ``assignment`` is one of the fixed column clauses above, never input.
        tx.execute(
            f"UPDATE {self.t('creations_view')} SET {assignment}"
            " WHERE identity_id = ? AND tenure = ?",
            (value, identity, tenure),
        )
