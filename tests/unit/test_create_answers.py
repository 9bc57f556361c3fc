"""The create route's answer body (api/answers.py) is what flask-smorest's dump
through ``CreateTaskResponseSchema`` would be, key order included: real task
DTOs with every outcome are copied as they are, and any value the schema would
change (or refuse) goes through marshmallow itself."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kandev_es.api.answers import _KINDS, dump
from kandev_es.creation.outcomes import CreateResult, CreateTaskResponseSchema, Outcome
from kandev_es.views import task_dto
from tests.unit.test_task_representation import tasks

SCHEMA = CreateTaskResponseSchema()


def _same(body: dict[str, Any]) -> None:
    try:
        expected = SCHEMA.dump(body)
    except Exception as error:  # the schema refuses it: so must dump()
        with pytest.raises(type(error)):
            dump(body)
        return
    got = dump(body)
    assert got == expected
    assert list(got) == list(expected)
    assert json.dumps(got, default=repr) == json.dumps(expected, default=repr)


def test_every_field_of_the_schema_takes_the_copying_path():
    assert _KINDS is not None and set(_KINDS) == set(SCHEMA.fields)


@given(tasks(), st.sampled_from(list(Outcome)), st.none() | st.text(max_size=10))
def test_a_real_answer_dumps_as_the_schema_dumps_it(task, outcome, handle):
    _same(CreateResult(outcome, task_dto(task), handle).to_response())


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
    st.uuids(), st.lists(st.text(max_size=3) | st.integers(), max_size=3),
    st.tuples(st.text(max_size=3)),
)


@given(st.dictionaries(st.sampled_from([*SCHEMA.fields, "unknown"]), ODD_VALUES))
def test_any_other_value_is_dumped_by_the_schema_itself(body):
    _same(body)


def test_values_the_schema_changes_are_changed():
    task_id = uuid.uuid4()
    body = {"id": task_id, "revision": True, "repositories": ("a",), "archived": 0, "x": 1}
    assert dump(body) == {
        "id": str(task_id), "repositories": ["a"], "archived": False, "revision": 1,
    }
