"""The creations projection applied a batch at a time (deletions first, the
inserts and updates of rows deleted later in the batch skipped) leaves exactly
the rows that applying its events one by one leaves, for every batch size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kandev_es.projections.creations import CreationsProjection

from tests.integration.helpers import create, start_unsettled_creation


def _history(client, services, workspace, secret) -> None:
    for i in range(3):
        assert create(client, secret, external_id=f"C-{i}", title="done").status_code == 200
    start_unsettled_creation(services, workspace, "IN-FLIGHT")
    recovered = start_unsettled_creation(services, workspace, "RECOVERED")
    identity = services.app.repository.get(recovered.identity_id)
    identity.recover(1, "runtime", datetime.now(UTC) + timedelta(minutes=9))
    services.app.save_atomically(identity)
    aborted = start_unsettled_creation(services, workspace, "ABORTED")
    identity = services.app.repository.get(aborted.identity_id)
    identity.begin_aborting(1, "test")
    identity.abort(1)
    services.app.save_atomically(identity)
    assert create(client, secret, external_id="C-last", title="done").status_code == 200


def _rows(services, apply) -> list[tuple[str, ...]]:
    projection = CreationsProjection()
    topics = set(projection.topics)
    events = [
        (services.app.mapper.to_domain_event(n), n.id)
        for n in services.app.recorder.select_notifications(start=1, limit=1_000_000)
        if n.topic in topics
    ]
    backend = services.database.backend
    with services.database.transaction() as tx:
        tx.execute("DELETE FROM creations_view")
        apply(projection, tx, events, backend)
        rows = tx.execute(
            "SELECT identity_id, tenure, workspace_id, task_id, phase, epoch, lease_expires_at"
            " FROM creations_view ORDER BY identity_id, tenure"
        )
    return [tuple(map(str, row)) for row in rows]


def test_batches_leave_the_rows_events_one_by_one_leave(client, services, workspace, member):
    _, secret = member
    _history(client, services, workspace, secret)

    def one_by_one(projection, tx, events, backend):
        for event, position in events:
            projection.apply(tx, event, position, backend)

    expected = _rows(services, one_by_one)
    assert len(expected) == 2  # in flight and recovered; the done and aborted are gone
    assert sorted(row[5] for row in expected) == ["0", "1"]  # the recovery's epoch

    for size in (1, 2, 3, 5, 8, 1000):

        def batched(projection, tx, events, backend, size=size):
            for start in range(0, len(events), size):
                projection.apply_batch(tx, events[start : start + size], backend)

        assert _rows(services, batched) == expected, size

    services.projections.catch_up()  # the live runner, batching too, agrees
    with services.database.transaction() as tx:
        live = tx.execute(
            "SELECT identity_id, tenure, workspace_id, task_id, phase, epoch, lease_expires_at"
            " FROM creations_view ORDER BY identity_id, tenure"
        )
    assert [tuple(map(str, row)) for row in live] == expected
