"""Rules of the Identity, Task and Workspace aggregates.

Identity: one stream per (workspace, external ID); each Claimed opens a tenure,
"the holder" is the latest tenure neither released nor aborted, and a released
tenure may still finish (AC-TASKS-EXTERNAL-ID-001.6, .7). State is derived from
events only, so every history must replay to the same state.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Mapper, UUIDAsHex
from hypothesis import given
from hypothesis import strategies as st

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import (
    COMPLETED,
    COMPLETING,
    OUTCOME_CREATED,
    OUTCOME_CREATED_IDENTITY_LOST,
    PREPARING,
    Identity,
)
from kandev_es.domain.task import TASK_ACTIVE, TASK_PREPARING, Task
from kandev_es.domain.workspace import Workspace, workspace_id_for

WORKSPACE = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")
LEASE = datetime(2026, 8, 7, 12, 0, tzinfo=UTC)


# ----- helpers -------------------------------------------------------------------
def new_identity(external_id: str | None = "JIRA-1") -> Identity:
    aggregate_id = identity_id(WORKSPACE, external_id) if external_id else uuid.uuid4()
    return Identity.register(aggregate_id, WORKSPACE, external_id)


def claim(identity: Identity, owner: str = "owner-a", **overrides: Any) -> int:
    fields: dict[str, Any] = {
        "task_id": uuid.uuid4(),
        "owner_id": owner,
        "actor": f"token:{owner}",
        "plan": {"title": "Fix login", "steps": ["branch"]},
        "plan_hash": "ab" * 32,
        "lease_expires_at": LEASE + timedelta(minutes=5),
    }
    fields.update(overrides)
    return identity.claim(**fields).number


def replay(events: list[Aggregate.Event]) -> Any:
    aggregate: Any = None
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


def state(aggregate: Aggregate) -> dict[str, Any]:
    return {k: v for k, v in vars(aggregate).items() if k != "_pending_events"}


def assert_replays(aggregate: Aggregate, history: list[Aggregate.Event]) -> None:
    history.extend(aggregate.collect_events())
    replica = replay(history)
    assert type(replica) is type(aggregate)
    assert replica.id == aggregate.id
    assert replica.version == aggregate.version == len(history)
    assert state(replica) == state(aggregate)


def new_task(external_id: str | None = "JIRA-1", **overrides: Any) -> Task:
    fields: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "identity_id": uuid.uuid4(),
        "identifier": "KAN-1",
        "external_id": external_id,
        "title": "Fix login",
        "description": "",
        "workflow": "default",
        "workflow_step": "backlog",
        "parent_id": None,
        "repositories": ["app"],
        "attachments": [],
        "start_agent": False,
        "agent_profile": None,
        "created_by": "token:owner-a",
    }
    fields.update(overrides)
    return Task.create(uuid.uuid4(), **fields)


# ----- Identity: claiming -------------------------------------------------------------
def test_first_claim_opens_tenure_one_and_becomes_the_holder() -> None:
    identity = new_identity()
    task_id = uuid.uuid4()
    number = claim(identity, task_id=task_id)
    assert number == 1
    holder = identity.holder
    assert holder is not None
    assert holder.number == 1
    assert holder.task_id == task_id
    assert holder.phase == PREPARING
    assert not holder.settled


def test_fresh_identity_has_no_holder() -> None:
    assert new_identity().holder is None


def test_second_claim_while_held_is_refused() -> None:
    identity = new_identity()
    claim(identity, owner="owner-a")
    version = identity.version
    with pytest.raises(DomainRuleBroken):
        claim(identity, owner="owner-b")
    assert identity.version == version
    assert identity.holder is not None
    assert identity.holder.owner_id == "owner-a"


def test_second_claim_on_a_settled_holder_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    identity.complete(number)
    with pytest.raises(DomainRuleBroken):
        claim(identity, owner="owner-b")


def test_claim_stores_the_plan_and_its_hash() -> None:
    identity = new_identity()
    plan = {"title": "Fix login", "steps": ["branch", "worktree"]}
    number = claim(identity, plan=plan, plan_hash="cd" * 32)
    tenure = identity.tenure(number)
    assert tenure.plan == plan
    assert tenure.plan_hash == "cd" * 32


def test_unknown_tenure_is_a_domain_rule_violation() -> None:
    identity = new_identity()
    claim(identity)
    with pytest.raises(DomainRuleBroken):
        identity.tenure(2)
    with pytest.raises(DomainRuleBroken):
        identity.begin_completing(2)


# ----- Identity: completion ----------------------------------------------------------
def test_begin_completing_then_complete_gives_created_and_a_settled_holder() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    assert identity.tenure(number).phase == COMPLETING
    assert identity.holder is not None
    assert not identity.holder.settled
    outcome = identity.complete(number)
    assert outcome == OUTCOME_CREATED == "created"
    holder = identity.holder
    assert holder is not None
    assert holder.number == number
    assert holder.phase == COMPLETED
    assert holder.settled
    assert holder.outcome == OUTCOME_CREATED


def test_complete_without_completing_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    with pytest.raises(DomainRuleBroken):
        identity.complete(number)
    assert identity.tenure(number).phase == PREPARING


def test_begin_completing_twice_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    with pytest.raises(DomainRuleBroken):
        identity.begin_completing(number)


def test_complete_twice_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    identity.complete(number)
    with pytest.raises(DomainRuleBroken):
        identity.complete(number)


def test_steps_are_recorded_while_preparing_and_refused_once_completing() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.record_step(number, "branch", "k-branch", "started", {})
    identity.record_step(number, "branch", "k-branch", "succeeded", {"sha": "abc"})
    assert identity.tenure(number).steps["branch"] == {
        "key": "k-branch",
        "status": "succeeded",
        "evidence": {"sha": "abc"},
    }
    identity.begin_completing(number)
    with pytest.raises(DomainRuleBroken):
        identity.record_step(number, "worktree", "k-wt", "started", {})
    assert "worktree" not in identity.tenure(number).steps


# ----- Identity: release (AC-6, AC-7) --------------------------------------------------
def test_releasing_a_preparing_tenure_then_completing_gives_created_identity_lost() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.release(number, operation_id="op-1", reason="operator", actor="token:test")
    assert identity.holder is None
    identity.begin_completing(number)
    outcome = identity.complete(number)
    assert outcome == OUTCOME_CREATED_IDENTITY_LOST == "created_identity_lost"
    tenure = identity.tenure(number)
    assert tenure.settled
    assert tenure.outcome == OUTCOME_CREATED_IDENTITY_LOST
    assert tenure.release_operation_id == "op-1"
    assert identity.holder is None


def test_after_release_a_new_claim_opens_tenure_two_while_tenure_one_can_still_complete() -> None:
    identity = new_identity()
    first_task, second_task = uuid.uuid4(), uuid.uuid4()
    first = claim(identity, owner="owner-a", task_id=first_task)
    identity.release(first, operation_id="op-1", reason="operator", actor="token:test")
    second = claim(identity, owner="owner-b", task_id=second_task)
    assert (first, second) == (1, 2)
    assert identity.holder is not None
    assert identity.holder.number == 2
    assert identity.holder.task_id == second_task

    identity.begin_completing(first)
    assert identity.complete(first) == OUTCOME_CREATED_IDENTITY_LOST
    # The released tenure finishing does not disturb the new holder.
    assert identity.holder is not None
    assert identity.holder.number == 2
    assert identity.holder.phase == PREPARING

    identity.begin_completing(second)
    assert identity.complete(second) == OUTCOME_CREATED
    assert identity.holder.number == 2
    assert identity.holder.settled


def test_release_of_a_completed_tenure_frees_the_identity() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    identity.complete(number)
    identity.release(number, operation_id="op-1", reason="operator", actor="token:test")
    assert identity.holder is None
    assert identity.tenure(number).outcome == OUTCOME_CREATED
    assert claim(identity, owner="owner-b") == 2


def test_release_of_an_already_released_tenure_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.release(number, operation_id="op-1", reason="operator", actor="token:test")
    version = identity.version
    with pytest.raises(DomainRuleBroken):
        identity.release(number, operation_id="op-2", reason="operator", actor="token:test")
    assert identity.version == version
    assert identity.tenure(number).release_operation_id == "op-1"


def test_release_of_a_superseded_tenure_never_affects_the_later_holder() -> None:
    identity = new_identity()
    first = claim(identity, owner="owner-a")
    identity.release(first, operation_id="op-1", reason="operator", actor="token:test")
    second = claim(identity, owner="owner-b")
    with pytest.raises(DomainRuleBroken):
        identity.release(first, operation_id="op-1", reason="operator", actor="token:test")
    assert identity.holder is not None
    assert identity.holder.number == second
    assert not identity.tenure(second).released


def test_release_of_a_completing_tenure_is_refused() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.begin_completing(number)
    with pytest.raises(DomainRuleBroken):
        identity.release(number, operation_id="op-1", reason="operator", actor="token:test")


def test_workspace_deletion_release_is_recorded_with_its_generation() -> None:
    identity = new_identity()
    number = claim(identity)
    identity.release(
        number, "op-del", reason="workspace_deleted", deletion_generation=3, actor="token:x"
    )
    (_registered, _claimed, released) = identity.collect_events()
    assert isinstance(released, Identity.Released)
    assert released.reason == "workspace_deleted"
    assert released.deletion_generation == 3
    assert released.tenure == number
    assert released.actor == "token:x"
    assert identity.tenure(number).released_by == "token:x"


def test_released_event_stored_before_actor_existed_replays_with_none() -> None:
    """An old Released (no actor in its stored state) replays; auditors see None."""
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    mapper: Mapper[uuid.UUID] = Mapper(transcoder=transcoder)
    identity = new_identity()
    number = claim(identity)
    identity.release(number, "op-old", reason="operator", actor="token:new")
    events = identity.collect_events()
    stored = [mapper.to_stored_event(event) for event in events]
    state = json.loads(stored[-1].state)
    del state["actor"]
    stored[-1] = dataclasses.replace(stored[-1], state=json.dumps(state).encode())
    replayed: Identity | None = None
    for item in stored:
        event = mapper.to_domain_event(item)
        replayed = event.mutate(replayed)  # type: ignore[attr-defined]
    assert replayed is not None
    assert replayed.tenure(number).released
    assert replayed.tenure(number).released_by is None


# ----- Identity: events and replay ------------------------------------------------------
def test_every_event_after_claimed_names_its_tenure() -> None:
    identity = new_identity()
    first = claim(identity)
    identity.record_step(first, "branch", "k", "succeeded", {})
    identity.release(first, "op-1", "operator", actor="token:test")
    second = claim(identity, owner="owner-b")
    identity.begin_completing(first)
    identity.complete(first)
    events = identity.collect_events()
    assert isinstance(events[0], Identity.Registered)
    tenures = [event.tenure for event in events[1:]]
    assert tenures == [first, first, first, second, first, first]


def test_anonymous_identity_has_no_external_id_and_follows_the_same_protocol() -> None:
    identity = new_identity(external_id=None)
    number = claim(identity)
    identity.begin_completing(number)
    assert identity.complete(number) == OUTCOME_CREATED
    assert identity.external_id is None
    assert_replays(identity, [])


def test_registered_identity_replays() -> None:
    identity = new_identity()
    assert_replays(identity, [])


def test_happy_path_history_replays_to_the_same_state() -> None:
    identity = new_identity()
    history: list[Aggregate.Event] = []
    number = claim(identity)
    identity.record_step(number, "branch", "k-branch", "started", {})
    assert_replays(identity, history)
    identity.record_step(number, "branch", "k-branch", "succeeded", {"sha": "abc"})
    identity.begin_completing(number)
    identity.complete(number)
    assert_replays(identity, history)
    replica = replay(history)
    assert replica.holder.settled
    assert replica.holder.steps["branch"]["evidence"] == {"sha": "abc"}


def test_identity_lost_history_with_a_second_tenure_replays_to_the_same_state() -> None:
    identity = new_identity()
    history: list[Aggregate.Event] = []
    first = claim(identity, owner="owner-a")
    identity.release(first, "op-1", "operator", actor="token:test")
    second = claim(identity, owner="owner-b")
    identity.begin_completing(first)
    identity.complete(first)
    identity.record_step(second, "branch", "k2", "unknown", {"probe": "pending"})
    assert_replays(identity, history)
    replica = replay(history)
    assert replica.holder.number == second
    assert replica.tenure(first).outcome == OUTCOME_CREATED_IDENTITY_LOST
    assert replica.tenure(first).released


COMMANDS = st.lists(st.sampled_from(["claim", "step", "begin", "complete", "release"]), max_size=25)


@given(COMMANDS, st.data())
def test_any_sequence_of_allowed_commands_replays_to_the_same_state(
    commands: list[str], data: st.DataObject
) -> None:
    identity = new_identity()
    for index, command in enumerate(commands):
        numbers = sorted(identity.tenures) or [1]
        number = data.draw(st.sampled_from(numbers))
        try:
            if command == "claim":
                claim(identity, owner=f"owner-{index}")
            elif command == "step":
                identity.record_step(number, f"s{index}", f"k{index}", "succeeded", {"i": index})
            elif command == "begin":
                identity.begin_completing(number)
            elif command == "complete":
                identity.complete(number)
            else:
                identity.release(number, f"op-{index}", "operator", actor="token:test")
        except DomainRuleBroken:
            pass
        # Invariant: at most one tenure holds the identity at any time.
        assert sum(1 for tenure in identity.tenures.values() if tenure.holds) <= 1
    assert_replays(identity, [])


# ----- Task --------------------------------------------------------------------------------
def test_new_task_is_preparing_at_revision_one() -> None:
    task = new_task()
    assert task.phase == TASK_PREPARING
    assert task.revision == 1
    assert task.external_id == "JIRA-1"
    assert not task.archived
    assert not task.deleted


def test_update_changes_fields_and_bumps_revision() -> None:
    task = new_task()
    task.update({"title": "Fix logout", "description": "details"})
    assert task.title == "Fix logout"
    assert task.description == "details"
    assert task.revision == 2
    task.update({"workflow_step": "review"})
    assert task.workflow_step == "review"
    assert task.revision == 3


def test_no_op_update_emits_no_event_and_keeps_revision() -> None:
    task = new_task()
    task.collect_events()
    task.update({"title": "Fix login", "workflow_step": "backlog"})
    task.update({})
    assert task.collect_events() == []
    assert task.revision == 1


def test_update_records_only_the_fields_that_changed() -> None:
    task = new_task()
    task.collect_events()
    task.update({"title": "Fix login", "description": "new"})
    (updated,) = task.collect_events()
    assert isinstance(updated, Task.Updated)
    assert updated.changes == {"description": "new"}


@pytest.mark.parametrize("name", ["external_id", "identifier", "workspace_id", "revision", "nope"])
def test_update_of_a_non_editable_field_is_refused(name: str) -> None:
    task = new_task()
    before = state(task)
    with pytest.raises(DomainRuleBroken):
        task.update({name: "changed"})
    assert state(task) == before


def test_archive_sets_archived_and_bumps_revision_once() -> None:
    task = new_task()
    task.collect_events()
    task.archive()
    assert task.archived
    assert task.revision == 2
    task.archive()
    assert task.revision == 2
    assert len(task.collect_events()) == 1


def test_clear_external_id_removes_it_and_bumps_revision() -> None:
    task = new_task()
    task.clear_external_id(operation_id="op-1", reason="operator")
    assert task.external_id is None
    assert task.revision == 2
    task.collect_events()
    task.clear_external_id(operation_id="op-2", reason="operator")
    assert task.collect_events() == []
    assert task.revision == 2


def test_clear_external_id_on_a_task_without_one_emits_nothing() -> None:
    task = new_task(external_id=None)
    task.collect_events()
    task.clear_external_id(operation_id="op-1", reason="operator")
    assert task.collect_events() == []
    assert task.revision == 1


def test_activate_with_drop_external_id_removes_the_id() -> None:
    task = new_task()
    task.activate(drop_external_id=True)
    assert task.phase == TASK_ACTIVE
    assert task.external_id is None


def test_activate_without_drop_keeps_the_id() -> None:
    task = new_task()
    task.activate(drop_external_id=False)
    assert task.phase == TASK_ACTIVE
    assert task.external_id == "JIRA-1"


def test_activate_twice_is_refused() -> None:
    task = new_task()
    task.activate(drop_external_id=False)
    with pytest.raises(DomainRuleBroken):
        task.activate(drop_external_id=True)
    assert task.external_id == "JIRA-1"


def test_delete_then_update_is_refused() -> None:
    task = new_task()
    task.delete()
    assert task.deleted
    with pytest.raises(DomainRuleBroken):
        task.update({"title": "after delete"})
    assert task.title == "Fix login"


@pytest.mark.parametrize(
    "command",
    [
        lambda t: t.archive(),
        lambda t: t.delete(),
        lambda t: t.clear_external_id("op-1", "operator"),
    ],
    ids=["archive", "delete", "clear_external_id"],
)
def test_deleted_task_refuses_further_changes(command: Any) -> None:
    task = new_task()
    task.delete()
    task.collect_events()
    with pytest.raises(DomainRuleBroken):
        command(task)
    assert task.collect_events() == []


def test_task_created_copies_its_lists() -> None:
    repositories = ["app"]
    task = new_task(repositories=repositories)
    repositories.append("other")
    assert task.repositories == ["app"]


def test_task_history_replays_to_the_same_state() -> None:
    task = new_task()
    history: list[Aggregate.Event] = []
    task.activate(drop_external_id=False)
    task.update({"title": "Fix logout"})
    task.archive()
    task.clear_external_id("op-1", "operator")
    assert_replays(task, history)
    task.delete()
    assert_replays(task, history)
    replica = replay(history)
    assert replica.revision == 5
    assert replica.deleted
    assert replica.external_id is None


def test_task_activated_with_dropped_id_replays_without_the_id() -> None:
    task = new_task()
    history: list[Aggregate.Event] = []
    task.activate(drop_external_id=True)
    assert_replays(task, history)
    assert replay(history).external_id is None


# ----- Workspace ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["", "-acme", ".acme", "_acme", "ac me", "acme/x", "caf\u00e9", "a" * 65, " acme"]
)
def test_invalid_workspace_name_is_refused(name: str) -> None:
    with pytest.raises(DomainRuleBroken):
        Workspace.open(name)


@pytest.mark.parametrize("prefix", ["", "kan", "Kan", "1KAN", "KA-N", "KAN ", "ABCDEFGHIJK"])
def test_invalid_task_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(DomainRuleBroken):
        Workspace.open("acme", task_prefix=prefix)


@pytest.mark.parametrize(
    ("name", "prefix"), [("acme\n", "KAN"), ("acme", "KAN\n")], ids=["name", "prefix"]
)
def test_trailing_newline_in_name_or_prefix_is_refused(name: str, prefix: str) -> None:
    with pytest.raises(DomainRuleBroken):
        Workspace.open(name, task_prefix=prefix)


@pytest.mark.parametrize("name", ["a", "acme", "Acme-2.0_x", "a" * 64, "9lives"])
def test_valid_workspace_name_opens(name: str) -> None:
    workspace = Workspace.open(name, task_prefix="OPS1")
    assert workspace.name == name
    assert workspace.task_prefix == "OPS1"
    assert workspace.workflows["default"][0] == "backlog"


def test_default_task_prefix_is_kan() -> None:
    assert Workspace.open("acme").task_prefix == "KAN"


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True))
def test_workspace_id_is_derived_deterministically_from_the_name(name: str) -> None:
    assert workspace_id_for(name) == workspace_id_for(name)
    assert Workspace.open(name).id == workspace_id_for(name)
    assert workspace_id_for(name) != workspace_id_for(name + "x")


def test_workspace_ids_differ_by_name() -> None:
    assert workspace_id_for("acme") != workspace_id_for("globex")
    assert workspace_id_for("acme") != workspace_id_for("Acme")


def test_registering_a_repository_twice_is_refused() -> None:
    workspace = Workspace.open("acme")
    workspace.register_repository("app", "/srv/app")
    with pytest.raises(DomainRuleBroken):
        workspace.register_repository("app", "/srv/other")
    assert workspace.repositories == {"app": "/srv/app"}
    assert_replays(workspace, [])
