"""No silent holes across versions. A newer version's event (a topic this
version does not know) sits in the log between events this version knows: the
projection loop never moves its position past it. A replay (``projections
rebuild``) stops just before it, logs why at ERROR, refuses to swap in tables
without it (the live read models stay), and ``/readyz`` answers 503 saying
which projection stopped and why. An earlier version skipped such events and
left the hole for good (CHANGELOG: mixed-version windows). Both backends."""

from __future__ import annotations

import logging
import uuid

import pytest
from eventsourcing.persistence import StoredEvent
from kandev_es.projections.rebuild import rebuild

from kandev_es.errors import UnknownTopic

NEWER = "kandev_es.domain.task:Task.FromANewerVersion"


def test_the_projection_loop_stops_before_an_event_of_an_unknown_topic(
    services, workspace, member, client, caplog
):
    principal, _ = member
    services.creation.create(principal, {"title": "before"})
    services.app.recorder.insert_events(
        [StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic=NEWER, state=b"{}")]
    )
    newer_id = services.app.max_notification_id()
    services.creation.create(principal, {"title": "after"})

    with (
        caplog.at_level(logging.ERROR, logger="kandev_es.projections"),
        pytest.raises(UnknownTopic) as refused,
    ):
        rebuild(services.projections, "tasks")

    assert NEWER in str(refused.value)
    assert services.projections.position("tasks@rebuild") == newer_id - 1  # never past it
    assert any(NEWER in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    titles = sorted(t["title"] for t in services.tasks.list(workspace.id).items)
    assert titles == ["after", "before"]  # the live read model was not swapped
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert NEWER in ready.json["projections_stopped"]["tasks@rebuild"]
