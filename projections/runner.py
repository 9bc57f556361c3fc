"""Our own projection loop (DESIGN §6): read a batch of notifications after the
tracked position, apply them and store the new position in one transaction."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from kandev_es.projections.base import Projection

from kandev_es.application import Tasks
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.projections")


class ProjectionRunner:
    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: Sequence[Projection],
        batch_size: int = 500,
    ) -> None:
        self._app = app
        self._database = database
        self._projections = list(projections)
        self._batch_size = batch_size
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def position(self, name: str) -> int:
        with self._database.transaction() as tx:
            rows = tx.execute("SELECT position FROM projection_tracking WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    def lag(self) -> dict[str, int]:
        head = self._app.max_notification_id()
        return {p.name: head - self.position(p.name) for p in self._projections}

    def run_once(self) -> int:
        """Apply one batch to every projection; return how many events were applied."""
        applied = 0
        with self._lock:
            for projection in self._projections:
                applied += self._run_batch(projection)
        return applied

    def catch_up(self) -> None:
        while self.run_once():
            pass

    def _run_batch(self, projection: Projection) -> int:
        backend = self._database.backend
        lock = " FOR UPDATE" if backend == "postgres" else ""
        with self._database.transaction() as tx:
            # Runners in several processes serialise on the tracking row, so an
            # event is never applied twice.
            tx.execute(
                "INSERT INTO projection_tracking (name, position) VALUES (?, 0)"
                " ON CONFLICT (name) DO NOTHING",
                (projection.name,),
            )
            rows = tx.execute(
                "SELECT position FROM projection_tracking WHERE name = ?" + lock,
                (projection.name,),
            )
            position = int(rows[0][0])
            notifications = self._app.recorder.select_notifications(
                start=position, limit=self._batch_size, inclusive_of_start=False
            )
            if not notifications:
                return 0
            for notification in notifications:
                event = self._app.mapper.to_domain_event(notification)
                projection.apply(tx, event, notification.id, backend)
            last = notifications[-1].id
            tx.execute(
                "UPDATE projection_tracking SET position = ? WHERE name = ?",
                (last, projection.name),
            )
        return len(notifications)

    def run_forever(self, poll_seconds: float) -> None:
        while not self._stop.is_set():
            try:
                applied = self.run_once()
            except Exception:  # keep the loop alive; the next pass retries
                log.exception("projection pass failed; retrying")
                applied = 0
            if not applied:
                self._stop.wait(poll_seconds)

    def start_thread(self, poll_seconds: float) -> threading.Thread:
        thread = threading.Thread(
            target=self.run_forever, args=(poll_seconds,), name="projections", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
