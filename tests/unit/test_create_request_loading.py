"""A create body is loaded (creation/request.py) exactly as marshmallow's
``CreateTaskRequestSchema().load`` loads it: the plain loop answers only bodies
the schema would load without changing a value's type, with the same dict,
key order included; everything else -- every refusal among it -- goes through
the schema itself, so each bad input keeps its typed 422 and messages."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from kandev_es.creation.request import (
    _RULES,
    CreateTaskRequestSchema,
    _plain_load,
    load_create_request,
)
from kandev_es.errors import ValidationFailed

SCHEMA = CreateTaskRequestSchema()
NAMES = [name for name in SCHEMA.load_fields]


def _texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=8),
        st.sampled_from(["", " ", "\t\n", " x ", "\u00a0", "\u2003y"]),
        # across every length bound of the schema (1, 100, 200, 500, 100000)
        st.sampled_from([0, 1, 2, 99, 100, 101, 199, 200, 201, 499, 500, 501, 100_000, 100_001])
        .flatmap(lambda n: st.sampled_from(["x" * n, " " + "x" * n, "x" * n + "  "])),
        st.uuids().map(str),
        st.uuids().map(lambda u: u.hex),
        st.uuids().map(lambda u: "{" + str(u) + "}"),
        st.uuids().map(lambda u: "urn:uuid:" + str(u)),
    )


def _values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        _texts(), st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False),
    )
    return st.one_of(
        scalars,
        st.lists(st.one_of(_texts(), st.none(), st.integers(0, 1)), max_size=3),
        st.integers(0, 52).map(lambda n: ["r"] * n),
        st.dictionaries(st.text(max_size=3), scalars, max_size=2),
    )


bodies = st.dictionaries(
    st.one_of(st.sampled_from(NAMES), st.sampled_from(["extra", "Title", "id"])),
    _values(),
    max_size=8,
)


VALID: dict[str, Any] = {
    "workspace_id": str(uuid.uuid4()), "external_id": "EXT-1", "title": "a task",
    "description": "d", "workflow": "w", "workflow_step": None, "repositories": ["main"],
    "attachments": ["a"], "start_agent": False, "agent_profile": "p",
    "parent_id": str(uuid.uuid4()),
}
# Valid bodies with one field (or two) replaced: where a loose rule would show.
nearly_valid = st.builds(
    lambda keep, changed: {**{k: VALID[k] for k in keep}, **changed},
    st.sets(st.sampled_from(NAMES)).map(lambda keep: sorted(keep | {"title"})),
    st.dictionaries(st.sampled_from(NAMES), _values(), min_size=1, max_size=2),
)


def _with_title(body: dict[str, Any]) -> dict[str, Any]:
    return {"title": "a task", **body}


@settings(max_examples=1500, deadline=None)
@given(st.one_of(bodies, bodies.map(_with_title), nearly_valid))
def test_the_plain_loop_answers_what_the_schema_loads(body: dict[str, Any]) -> None:
    plain = _plain_load(body)
    try:
        expected = SCHEMA.load(dict(body))
    except Exception:  # the schema refuses it: the plain loop must not answer
        assert plain is None
        return
    if plain is not None:
        assert list(plain.items()) == list(expected.items())
        assert [type(v) for v in plain.values()] == [type(v) for v in expected.values()]


def test_the_loop_covers_every_field_and_takes_ordinary_bodies() -> None:
    assert _RULES is not None and [rule[0] for rule in _RULES] == NAMES
    bodies = [
        {"workspace_id": str(uuid.uuid4()), "external_id": "EXT-1", "title": " x "},
        {"title": "t", "description": "d", "workflow": "w", "workflow_step": None,
         "repositories": ["main"], "attachments": [], "start_agent": True,
         "agent_profile": "p", "parent_id": str(uuid.uuid4()), "external_id": None},
    ]
    for body in bodies:
        plain = _plain_load(body)
        assert plain is not None and plain == SCHEMA.load(body)
        assert plain["repositories"] is not body.get("repositories")  # a fresh list


@pytest.mark.parametrize("body", [
    {},
    {"title": "   "},
    {"title": "x" * 501},
    {"title": "t", "extra": 1},
    {"title": "t", "workflow": ""},
    {"title": "t", "repositories": [""]},
    {"title": "t", "start_agent": "yes please"},
    {"title": "t", "parent_id": "not-a-uuid"},
    {"title": "t", "description": None},
])
def test_a_bad_body_is_refused_with_the_schemas_own_messages(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as expected:
        SCHEMA.load(dict(body))
    with pytest.raises(ValidationFailed) as refused:
        load_create_request(body)
    assert refused.value.details["fields"] == expected.value.messages
