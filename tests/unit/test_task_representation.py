"""One task representation: ``task_dto`` is derived from ``TaskSchema`` (the REST
contract), so every field the schema declares is in the DTO, nothing else is,
and dumping a DTO through the schema (what every REST response does) changes
nothing: REST, MCP and the CLI answer the same body."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from marshmallow import fields

from kandev_es.api import tasks as task_routes
from kandev_es.creation.outcomes import CreateResult, CreateTaskResponseSchema, Outcome
from kandev_es.domain.task import Task
from kandev_es.views import TaskSchema, _reader, task_dto

text = st.text(max_size=20)
maybe_uuid = st.none() | st.uuids()


@st.composite
def tasks(draw: Any) -> Task:
    task = Task.create(
        draw(st.uuids()),
        workspace_id=draw(st.uuids()),
        identity_id=draw(st.uuids()),
        identifier=f"KAN-{draw(st.integers(min_value=1, max_value=10**6))}",
        external_id=draw(st.none() | st.text(min_size=1, max_size=20)),
        title=draw(text),
        description=draw(text),
        workflow="default",
        workflow_step=draw(st.sampled_from(["backlog", "done"])),
        parent_id=draw(maybe_uuid),
        repositories=draw(st.lists(text, max_size=3)),
        attachments=draw(st.lists(text, max_size=3)),
        start_agent=draw(st.booleans()),
        agent_profile=draw(st.none() | text),
        created_by="token:t",
    )
    if draw(st.booleans()):
        task.activate(drop_external_id=draw(st.booleans()))
        if draw(st.booleans()):
            task.update({"title": draw(text)})
        if draw(st.booleans()):
            task.archive()
    if draw(st.booleans()):
        task.forget("erase-1", "art. 17", "token:t")
    return task


@given(tasks())
def test_the_dto_has_exactly_the_schema_fields(task: Task) -> None:
    dto = task_dto(task)
    declared = set(TaskSchema().fields)
    if task.external_id is None:
        assert "external_id" not in dto  # omitted, never null
        declared.discard("external_id")
    if not task.forgotten:
        assert "forgotten" not in dto  # present (true) only once forgotten
        declared.discard("forgotten")
    assert set(dto) == declared
    assert list(dto) == [name for name in TaskSchema().fields if name in dto]


@given(tasks())
def test_dumping_the_dto_through_the_rest_schema_changes_nothing(task: Task) -> None:
    dto = task_dto(task)
    assert TaskSchema().dump(dto) == dto
    assert TaskSchema().validate(json.loads(json.dumps(dto))) == {}


@given(tasks())
def test_the_dto_reads_each_field_from_the_task(task: Task) -> None:
    dto = task_dto(task)
    assert dto["id"] == str(task.id) and dto["workspace_id"] == str(task.workspace_id)
    assert dto["parent_id"] == (str(task.parent_id) if task.parent_id else None)
    assert dto["state"] == task.phase
    assert dto["created_at"] == task.created_on.isoformat()
    assert dto["updated_at"] == task.modified_on.isoformat()
    assert dto.get("external_id") == task.external_id
    assert (dto["revision"], dto["archived"], dto["title"]) == (
        task.revision, task.archived, task.title,
    )
    assert dto["repositories"] == task.repositories
    assert dto["repositories"] is not task.repositories  # a copy, not the aggregate's list


def test_every_schema_extending_the_task_keeps_its_fields() -> None:
    for extended in (
        CreateTaskResponseSchema,
        task_routes.ReleaseResponseSchema,
        task_routes.LookupResponseSchema,
    ):
        assert set(TaskSchema().fields) <= set(extended().fields), extended.__name__
    nested = task_routes.TaskListSchema().fields["items"]
    assert isinstance(nested, fields.List)
    assert isinstance(nested.inner, fields.Nested) and nested.inner.nested is TaskSchema


def test_a_field_kind_the_dto_cannot_read_is_refused_at_import() -> None:
    with pytest.raises(TypeError, match="no reader"):
        _reader("children", fields.Nested(TaskSchema))


def test_a_task_attribute_named_in_metadata_is_read() -> None:
    task = Task.create(
        uuid.uuid4(), workspace_id=uuid.uuid4(), identity_id=uuid.uuid4(), identifier="KAN-1",
        external_id=None, title="t", description="", workflow="default",
        workflow_step="backlog", parent_id=None, repositories=[], attachments=[],
        start_agent=False, agent_profile=None, created_by="token:t",
    )
    read = _reader("who", fields.String(metadata={"task_attribute": "created_by"}))
    assert read(task) == "token:t"


@given(tasks(), st.sampled_from(list(Outcome)), st.none() | st.text(min_size=1, max_size=40))
def test_every_create_answer_is_exactly_its_schema(
    task: Task, outcome: Outcome, handle: str | None
) -> None:
    body = CreateResult(outcome, task_dto(task), handle).to_response()
    assert CreateTaskResponseSchema().dump(body) == body  # no field the contract lacks
    assert CreateTaskResponseSchema().validate(json.loads(json.dumps(body))) == {}
