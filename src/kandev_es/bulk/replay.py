"""Replay-safe batches: a batch sent with an ``Idempotency-Key`` records
itself under that key (domain/batch.py). The same key again answers the
first batch's results (``Idempotent-Replayed: true``); with another body,
422 ``idempotency_key_reused``; while the first is still being processed, 409
``batch_in_progress``. A batch that answered an error, or whose lease ran out
(its process died; a running batch renews it), leaves the key free to run
again: its items are found by external ID, so a second run makes nothing
twice."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.bulk.request import Batch
from kandev_es.bulk.results import BatchResult, ItemResult
from kandev_es.domain.batch import BatchOperation, batch_operation_id
from kandev_es.domain.task import Task
from kandev_es.errors import BatchInProgress, Contended, IdempotencyKeyReused, KandevError
from kandev_es.views import task_dto

ATTEMPTS = 8
READ_CHUNK = 500
# A batch holds its key for KANDEV_LEASE_SECONDS (30 s) and renews it after
# each window once a third of it has passed; a process that died frees its
# key within a lease. A run that outlives its lease anyway (one window of
# items with slow effects) may be run twice, which is safe by external ID.
RENEW_AFTER = 1 / 3
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def body_hash(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(_CANONICAL.encode(body).encode("utf-8", "surrogatepass")).hexdigest()


class BatchReplays:
    def __init__(self, app: Tasks, lease_seconds: float) -> None:
        self._app = app
        self._lease = timedelta(seconds=lease_seconds)

    def begin(
        self, workspace_id: uuid.UUID, key: str, body: Mapping[str, Any], batch: Batch
    ) -> BatchOperation | BatchResult:
        """The key's operation, begun or taken over, to run the batch under;
        or the first run's answer, replayed."""
        hashed = body_hash(body)
        for _ in range(ATTEMPTS):
            now = datetime.now(UTC)
            operation = self._app.load(batch_operation_id(workspace_id, key), BatchOperation)
            if operation is None:
                operation = BatchOperation.start(
                    workspace_id, key, hashed, len(batch.items), now + self._lease
                )
            elif operation.body_hash != hashed:
                raise IdempotencyKeyReused(
                    "this Idempotency-Key was used for a batch with another body",
                    key=key,
                )
            elif operation.results is not None:
                return self._replay(operation, operation.results, batch.atomic)
            elif operation.in_flight(now):
                raise BatchInProgress(
                    "a batch with this Idempotency-Key is still being processed;"
                    " retry with the same key once it ends",
                    key=key,
                )
            else:
                operation.restart(now + self._lease)
            try:
                self._app.save_atomically(operation)
            except VersionConflict:
                continue  # another request with this key began first: read again
            return operation
        raise Contended("the Idempotency-Key is contended; retry with it")

    def heartbeat(self, operation: BatchOperation) -> Callable[[], None]:
        """What the batch calls after each window: renews the key's lease once
        a third of it has passed."""

        def renew() -> None:
            now = datetime.now(UTC)
            if operation.lease_expires_at - now > self._lease * (1 - RENEW_AFTER):
                return
            operation.renew(now + self._lease)
            self._save_last(operation)

        return renew

    def finish(self, operation: BatchOperation, result: BatchResult) -> None:
        operation.finish([item.compact() for item in result.items])
        self._save_last(operation)

    def abandon(self, operation: BatchOperation, error: KandevError) -> None:
        """The batch answered ``error``: the key is free again. Best effort:
        if the store cannot take it now, the lease frees the key instead."""
        operation.abandon(error.code)
        with contextlib.suppress(KandevError):
            self._save_last(operation)

    def _save_last(self, operation: BatchOperation) -> None:
        """A run past its lease may find the key taken over: the later run's
        record stands (both ran the same items; each answers its own)."""
        with contextlib.suppress(VersionConflict):
            self._app.save_atomically(operation)

    def _replay(
        self, operation: BatchOperation, results: list[dict[str, Any]], atomic: bool
    ) -> BatchResult:
        wanted = [uuid.UUID(kept["task_id"]) for kept in results if "task_id" in kept]
        tasks: dict[uuid.UUID, Mapping[str, Any]] = {}
        for start in range(0, len(wanted), READ_CHUNK):
            reads = self._app.read_many(wanted[start : start + READ_CHUNK])
            for task_id, task in reads.items():
                assert isinstance(task, Task)  # a task's stream is never removed
                tasks[task_id] = task_dto(task)
        items = [ItemResult.replayed(kept, tasks) for kept in results]
        return BatchResult(operation.workspace_id, atomic, items, replayed=True)
