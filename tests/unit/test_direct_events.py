"""Identity and Task make their events and their new aggregates with the
library's lookups done once per class (domain/events.py): every command's
event, and the aggregate it leaves, must be exactly what the library's own
``trigger_event``, ``_create`` and created-event ``mutate`` make -- the same
fields in the same order, so the same stored bytes (which the hash chains
are computed over) -- and a bad event is refused as before."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import eventsourcing.domain
import pytest
from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Mapper, UUIDAsHex

from kandev_es.domain.events import DirectEvents, DirectInit
from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task

WORKSPACE = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _identity_history() -> list[Any]:
    identity = Identity.register(uuid.UUID(int=1), WORKSPACE, "JIRA-1")
    claim = {"task_id": uuid.UUID(int=2), "owner_id": "o", "actor": "token:a",
             "plan": {"title": "t", "steps": ["branch"], "repositories": ["app"]},
             "plan_hash": "ab" * 32, "lease_expires_at": NOW + timedelta(minutes=5)}
    identity.claim(**claim, handle_hash="cd" * 32, request_id="req-1", traceparent=None)
    identity.record_step(1, "branch", "k", "started", {"at": NOW.isoformat()},
                         lease_expires_at=NOW)
    identity.recover(1, "runtime", NOW, request_id=None)
    identity.park(1, "gave up")
    identity.renew_recovery(1, "op-1", actor="cli")
    identity.begin_completing(1)
    identity.complete(1)
    identity.release(1, "op-2", "manual", actor="cli")
    identity.claim(**claim)  # the defaults of handle_hash, request_id, traceparent
    identity.begin_aborting(2, "failed")
    identity.abort(2)
    anonymous = Identity.register(uuid.UUID(int=3), WORKSPACE, None)
    return [identity, anonymous]


def _task_history() -> list[Any]:
    fields: dict[str, Any] = {
        "workspace_id": WORKSPACE, "identity_id": uuid.UUID(int=1), "identifier": "KAN-1",
        "external_id": "JIRA-1", "title": "t", "description": "", "workflow": "default",
        "workflow_step": "backlog", "parent_id": None, "repositories": ["app"],
        "attachments": [], "start_agent": False, "agent_profile": None, "created_by": "token:a",
    }
    task = Task.create(uuid.UUID(int=4), **fields)
    task.activate(drop_external_id=False)
    task.update({"title": "u"})
    task.archive()
    task.clear_external_id("op-3", "released")
    task.delete()
    active = Task.create(uuid.UUID(int=5), active=True, **fields)
    aborted = Task.create(uuid.UUID(int=6), **fields)
    aborted.abort_creation()
    return [task, active, aborted]


def _stored(aggregates: list[Any]) -> list[Any]:
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    mapper: Mapper[uuid.UUID] = Mapper(transcoder)
    return [mapper.to_stored_event(e) for a in aggregates for e in a.pending_events]


def _replayed(aggregates: list[Any]) -> list[Any]:
    replayed = []
    for aggregate in aggregates:
        state = None
        for event in aggregate.pending_events:
            state = event.mutate(state)
        replayed.append(state)
    return replayed


def _by_the_library(monkeypatch: pytest.MonkeyPatch, history: Callable[[], list[Any]]) -> Any:
    with monkeypatch.context() as library:
        library.delattr(DirectEvents, "trigger_event")
        library.delattr(DirectEvents, "_create")
        library.delattr(DirectInit, "mutate")
        made = history()
        return made, _replayed(made)


@pytest.mark.parametrize("history", [_identity_history, _task_history])
def test_the_events_and_aggregates_are_the_librarys_field_for_field_and_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, history: Callable[[], list[Any]]
) -> None:
    monkeypatch.setattr(eventsourcing.domain, "datetime_now_with_tzinfo", lambda: NOW)
    direct = history()
    library, replayed_by_the_library = _by_the_library(monkeypatch, history)
    assert direct == library  # every aggregate's whole state, pending events included
    for ours, theirs in zip(direct, library, strict=True):
        for event, expected in zip(ours.pending_events, theirs.pending_events, strict=True):
            assert type(event) is type(expected)
            assert list(vars(event).items()) == list(vars(expected).items())
    assert _stored(direct) == _stored(library)
    # Replaying the events (a read) makes the same aggregates either way.
    assert _replayed(direct) == replayed_by_the_library
    assert [vars(a) for a in _replayed(direct)] == [vars(a) for a in replayed_by_the_library]


def test_a_bad_event_is_refused_as_the_library_refuses_it() -> None:
    identity = Identity.register(uuid.UUID(int=1), WORKSPACE, "JIRA-1")
    with pytest.raises(TypeError):
        identity.trigger_event(Identity.Completed, tenure=1)  # no outcome
    with pytest.raises(TypeError):
        identity.trigger_event(Identity.Aborted, tenure=1, unknown=True)
    with pytest.raises(TypeError):
        Task.create(uuid.UUID(int=4), title="only")
    with pytest.raises(AssertionError):  # a created event applied to an existing aggregate
        identity.pending_events[0].mutate(identity)
    assert identity.version == 1 and len(identity.pending_events) == 1


def test_an_init_parameter_no_event_field_names_keeps_its_default() -> None:
    from eventsourcing.domain import Aggregate

    class Sparse(DirectEvents, Aggregate):
        class Started(DirectInit, Aggregate.Created):
            name: str

        def __init__(self, name: str, size: int = 3) -> None:
            self.name, self.size = name, size

    made = Sparse._create(Sparse.Started, id=uuid.UUID(int=7), name="x")
    assert (made.name, made.size, made.version) == ("x", 3, 1)
