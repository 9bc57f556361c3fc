"""The task read model (projections/tasks.py ``advance``, which the tasks view
and the feeds apply event by event) holds after every event exactly what
``task_dto`` makes of the Task aggregate with the same events applied: the
same DTO, or None once the task is deleted or its creation aborted."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kandev_es.projections.tasks import advance

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.task import EDITABLE_FIELDS, Task
from kandev_es.views import task_dto

text = st.text(max_size=12)

# What a command sequence may do to a task after its creation.
commands = st.one_of(
    st.tuples(st.just("activate"), st.booleans()),
    st.tuples(st.just("abort"), st.none()),
    st.tuples(st.just("update"), st.dictionaries(st.sampled_from(EDITABLE_FIELDS), text,
                                                   max_size=3)),
    st.tuples(st.just("archive"), st.none()),
    st.tuples(st.just("clear_external_id"), st.none()),
    st.tuples(st.just("delete"), st.none()),
    st.tuples(st.just("forget"), st.none()),
)


def run(task: Task, command: str, argument: Any) -> None:
    try:
        if command == "activate":
            task.activate(drop_external_id=argument)
        elif command == "abort":
            task.abort_creation()
        elif command == "update":
            task.update(argument)
        elif command == "clear_external_id":
            task.clear_external_id("op-1", "released")
        elif command == "forget":
            task.forget("erase-1", "art. 17", "token:t")
        else:
            getattr(task, command)()
    except DomainRuleBroken:
        pass  # refused: no event, as in the service


@settings(deadline=None, max_examples=300)
@given(
    external_id=st.none() | st.text(min_size=1, max_size=12),
    parent_id=st.none() | st.uuids(),
    repositories=st.lists(text, max_size=2),
    script=st.lists(commands, max_size=8),
)
def test_the_read_model_is_task_dto_after_every_event(
    external_id: str | None, parent_id: uuid.UUID | None, repositories: list[str],
    script: list[tuple[str, Any]],
) -> None:
    task = Task.create(
        uuid.uuid4(), workspace_id=uuid.uuid4(), identity_id=uuid.uuid4(), identifier="KAN-1",
        external_id=external_id, title="t", description="", workflow="default",
        workflow_step="backlog", parent_id=parent_id, repositories=repositories,
        attachments=[], start_agent=False, agent_profile=None, created_by="token:t",
    )
    for command, argument in script:
        run(task, command, argument)

    states: dict[uuid.UUID, dict[str, Any] | None] = {}
    replayed: Task | None = None
    for event in task.collect_events():
        advance(states, event)
        replayed = event.mutate(replayed)
        assert isinstance(replayed, Task)
        gone = replayed.deleted or replayed.phase == "aborted"
        assert states[task.id] == (None if gone else task_dto(replayed)), type(event).__name__
