"""The events' stored bytes are the library's, whichever encoder wrote them:
the hash chains are computed over those bytes, and old code paths and
upcasting read them back (storage/transcoder.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    Transcoding,
    TranscodingNotRegisteredError,
    UUIDAsHex,
)

from kandev_es.application import Tasks
from kandev_es.config import Settings
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task
from kandev_es.storage.transcoder import EventTranscoder

WORKSPACE = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")


def _registered(transcoder: JSONTranscoder) -> JSONTranscoder:
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    return transcoder


def _created_events() -> list[Any]:
    """A create's events: Registered, Claimed, Completed, CreatedActive."""
    identity = Identity.register(identity_id(WORKSPACE, "JIRA-é"), WORKSPACE, "JIRA-é")
    task_id = uuid.uuid4()
    identity.claim(
        task_id=task_id, owner_id="host:1:x", actor="token:a",
        plan={"workspace_id": str(WORKSPACE), "title": "Fix \"login\" ✓", "steps": [],
              "repository_paths": {"app": "/srv/app"}, "wip_limit": None},
        plan_hash="ab" * 32, lease_expires_at=datetime.now(UTC) + timedelta(seconds=30),
        handle_hash="cd" * 32, request_id="req-1", traceparent=None,
    )
    identity.complete(1)
    task = Task.create(
        task_id, active=True, workspace_id=WORKSPACE, identity_id=identity.id,
        identifier="KAN-1", external_id="JIRA-é", title="Fix", description="line\nnext",
        workflow="default", workflow_step="backlog", parent_id=uuid.uuid4(),
        repositories=["app"], attachments=[], start_agent=False, agent_profile=None,
        created_by="token:a",
    )
    return [*identity.pending_events, *task.pending_events]


def test_a_creates_events_are_stored_as_the_library_stores_them() -> None:
    ours = Mapper[uuid.UUID](_registered(EventTranscoder()))
    library = Mapper[uuid.UUID](_registered(JSONTranscoder()))
    for event in _created_events():
        assert ours.to_stored_event(event) == library.to_stored_event(event)


@pytest.mark.parametrize("value", [
    {"nested": [uuid.uuid4(), {"at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)}]},
    {"naive": datetime(2026, 1, 2),
     "offset": datetime(2026, 1, 2, tzinfo=timezone(timedelta(hours=2)))},
    {"amount": Decimal("1.10"), "float": 0.1, "big": 10**30, "none": None, "flag": True},
    {"text": "\u2028\x00\"\\/ é ✓ \U0001f600", "empty": {}, "list": []},
    "a bare string",
])  # fmt: skip
def test_any_value_encodes_to_the_librarys_bytes_and_decodes_back(value: Any) -> None:
    ours, library = _registered(EventTranscoder()), _registered(JSONTranscoder())
    assert ours.encode(value) == library.encode(value)
    assert library.decode(ours.encode(value)) == value


def test_a_type_without_a_transcoding_is_refused_as_the_library_refuses_it() -> None:
    with pytest.raises(TranscodingNotRegisteredError):
        _registered(EventTranscoder()).encode({"x": object()})


def test_another_transcoding_registered_for_uuid_is_used_not_the_inlined_one() -> None:
    class UUIDAsText(Transcoding):
        type = uuid.UUID
        name = "uuid_text"

        def encode(self, obj: uuid.UUID) -> str:
            return str(obj)

        def decode(self, data: str) -> uuid.UUID:
            return uuid.UUID(data)

    ours, library = _registered(EventTranscoder()), _registered(JSONTranscoder())
    ours.register(UUIDAsText())
    library.register(UUIDAsText())
    value = {"id": uuid.uuid4()}
    assert ours.encode(value) == library.encode(value)
    assert b"uuid_text" in ours.encode(value)


def test_the_application_encodes_with_it(tmp_path: Any) -> None:
    app = Tasks(Settings(data_dir=tmp_path))
    try:
        assert type(app.mapper.transcoder) is EventTranscoder
    finally:
        app.close()
