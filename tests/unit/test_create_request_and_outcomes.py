"""Request-specific validation, the four create outcomes and
their response flags (docs/api.md: Outcomes; AC-2), and the
CreationPlan's hash (AC-TASKS-EXTERNAL-ID-001.5: the handle is bound to it).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kandev_es.creation.outcomes import UNSETTLED_ADVICE, CreateResult, Outcome
from kandev_es.creation.request import load_create_request
from kandev_es.domain.identity import OUTCOME_CREATED, OUTCOME_CREATED_IDENTITY_LOST
from kandev_es.domain.plan import CreationPlan
from kandev_es.errors import ValidationFailed, http_status

WORKSPACE = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")


def _fails(body: dict[str, Any]) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        load_create_request(body)
    return caught.value


# ----- load_create_request ------------------------------------------------------------
def test_missing_title_fails_validation_with_422() -> None:
    error = _fails({"description": "no title"})
    assert http_status(error) == 422
    assert error.code == "validation_failed"
    assert "title" in error.details["fields"]


@pytest.mark.parametrize("title", ["", " ", "   \t\n  ", "\u3000"])
def test_blank_title_fails_validation(title: str) -> None:
    error = _fails({"title": title})
    assert http_status(error) == 422
    assert "title" in error.details["fields"]


@pytest.mark.parametrize("title", [None, 42, 4.2, True, ["x"], {"t": "x"}], ids=repr)
def test_title_of_the_wrong_type_fails_validation(title: object) -> None:
    error = _fails({"title": title})
    assert http_status(error) == 422
    assert "title" in error.details["fields"]


def test_title_longer_than_500_characters_fails_validation() -> None:
    error = _fails({"title": "x" * 501})
    assert "title" in error.details["fields"]


def test_title_of_exactly_500_characters_is_accepted() -> None:
    assert load_create_request({"title": "x" * 500})["title"] == "x" * 500


def test_title_is_trimmed() -> None:
    assert load_create_request({"title": "  Fix login \n"})["title"] == "Fix login"


def test_unknown_field_is_rejected() -> None:
    error = _fails({"title": "Fix login", "colour": "red"})
    assert http_status(error) == 422
    assert "colour" in error.details["fields"]


def test_validation_failure_reports_every_bad_field() -> None:
    error = _fails({"title": "", "start_agent": "maybe", "repositories": "app"})
    assert {"title", "start_agent", "repositories"} <= set(error.details["fields"])


def test_validation_failure_serialises_as_a_typed_error() -> None:
    body = _fails({}).to_dict()
    assert body["error"] == "validation_failed"
    assert "title" in body["details"]["fields"]


def test_defaults_are_filled_in() -> None:
    loaded = load_create_request({"title": "Fix login"})
    assert loaded == {
        "title": "Fix login",
        "description": "",
        "workflow": "default",
        "workflow_step": None,
        "repositories": [],
        "attachments": [],
        "start_agent": False,
        "agent_profile": None,
        "parent_id": None,
    }


def test_default_lists_are_not_shared_between_requests() -> None:
    first = load_create_request({"title": "one"})
    first["repositories"].append("app")
    first["attachments"].append("blob")
    second = load_create_request({"title": "two"})
    assert second["repositories"] == []
    assert second["attachments"] == []


def test_supplied_fields_are_loaded() -> None:
    parent = uuid.uuid4()
    loaded = load_create_request(
        {
            "title": "Fix login",
            "description": "d",
            "workflow": "default",
            "workflow_step": "review",
            "repositories": ["app", "lib"],
            "attachments": ["att-1"],
            "start_agent": True,
            "agent_profile": "default",
            "parent_id": str(parent),
        }
    )
    assert loaded["workflow_step"] == "review"
    assert loaded["repositories"] == ["app", "lib"]
    assert loaded["attachments"] == ["att-1"]
    assert loaded["start_agent"] is True
    assert loaded["parent_id"] == parent


@pytest.mark.parametrize(
    "extra",
    [
        {"workspace_id": str(WORKSPACE)},
        {"external_id": "JIRA-1"},
        {"workspace_id": str(WORKSPACE), "external_id": "JIRA-1"},
        {"external_id": None},
    ],
)
def test_pre_lookup_fields_are_stripped_from_the_result(extra: dict[str, Any]) -> None:
    loaded = load_create_request({"title": "Fix login", **extra})
    assert "workspace_id" not in loaded
    assert "external_id" not in loaded
    assert loaded["title"] == "Fix login"


def test_caller_body_is_not_mutated() -> None:
    body = {"title": "  Fix login ", "external_id": "JIRA-1"}
    load_create_request(body)
    assert body == {"title": "  Fix login ", "external_id": "JIRA-1"}


@pytest.mark.parametrize(
    "body",
    [
        {"title": "t", "workflow": ""},
        {"title": "t", "repositories": [""]},
        {"title": "t", "repositories": ["r"] * 21},
        {"title": "t", "attachments": ["a"] * 51},
        {"title": "t", "parent_id": "not-a-uuid"},
        {"title": "t", "description": "d" * 100_001},
    ],
    ids=["empty-workflow", "empty-repo", "21-repos", "51-attachments", "bad-parent", "long-desc"],
)
def test_other_field_limits_fail_validation(body: dict[str, Any]) -> None:
    error = _fails(body)
    assert http_status(error) == 422
    (name,) = set(body) - {"title"}
    assert name in error.details["fields"]


# ----- outcomes ---------------------------------------------------------------------------
def test_there_are_exactly_four_outcomes_with_stable_wire_names() -> None:
    assert {outcome.value for outcome in Outcome} == {
        "created",
        "found_settled",
        "found_unsettled",
        "created_identity_lost",
    }


def test_identity_aggregate_outcomes_use_the_same_wire_names() -> None:
    assert Outcome(OUTCOME_CREATED) is Outcome.CREATED
    assert Outcome(OUTCOME_CREATED_IDENTITY_LOST) is Outcome.CREATED_IDENTITY_LOST


def test_exactly_the_found_outcomes_are_deduplicated() -> None:
    assert {o for o in Outcome if o.deduplicated} == {
        Outcome.FOUND_SETTLED,
        Outcome.FOUND_UNSETTLED,
    }


def test_only_found_unsettled_has_creation_incomplete() -> None:
    assert {o for o in Outcome if not o.creation_complete} == {Outcome.FOUND_UNSETTLED}


TASK = {"id": "3f0c0a7e-0000-4000-8000-000000000001", "identifier": "KAN-7", "title": "t"}


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_response_always_carries_outcome_and_both_flags(outcome: Outcome) -> None:
    body = CreateResult(outcome=outcome, task=dict(TASK)).to_response()
    assert body["outcome"] == outcome.value
    assert body["deduplicated"] is outcome.deduplicated
    assert body["creation_complete"] is outcome.creation_complete
    for key, value in TASK.items():
        assert body[key] == value


@pytest.mark.parametrize(
    "outcome",
    [Outcome.CREATED, Outcome.FOUND_SETTLED, Outcome.CREATED_IDENTITY_LOST],
    ids=lambda o: o.value,
)
def test_advice_is_absent_unless_found_unsettled(outcome: Outcome) -> None:
    assert "advice" not in CreateResult(outcome=outcome, task=dict(TASK)).to_response()


def test_found_unsettled_response_is_deduplicated_incomplete_and_advises() -> None:
    body = CreateResult(outcome=Outcome.FOUND_UNSETTLED, task=dict(TASK)).to_response()
    assert body["deduplicated"] is True
    assert body["creation_complete"] is False
    assert body["advice"] == UNSETTLED_ADVICE


def test_unsettled_advice_says_release_and_recreate_is_unsafe() -> None:
    advice = UNSETTLED_ADVICE.lower()
    assert "never release" in advice
    assert "create again" in advice
    # ...and names the safe alternatives docs/api.md's "The one unsafe thing" names.
    assert "proceed" in advice
    assert "poll" in advice
    assert "escalate" in advice


def test_to_response_does_not_mutate_the_task() -> None:
    task = dict(TASK)
    CreateResult(outcome=Outcome.FOUND_UNSETTLED, task=task).to_response()
    assert task == TASK


def test_response_is_json_serialisable() -> None:
    body = CreateResult(outcome=Outcome.FOUND_UNSETTLED, task=dict(TASK)).to_response()
    assert json.loads(json.dumps(body)) == body


# ----- CreationPlan.plan_hash ---------------------------------------------------------------
def make_plan(**overrides: Any) -> CreationPlan:
    fields: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "external_id": "JIRA-1",
        "identifier": "KAN-7",
        "title": "Fix login",
        "description": "",
        "workflow": "default",
        "workflow_step": "backlog",
        "repositories": ["app"],
        "attachments": [],
        "start_agent": False,
        "agent_profile": None,
        "parent_id": None,
        "repository_paths": {"app": "/srv/app"},
        "wip_limit": None,
        "steps": ["branch", "worktree"],
    }
    fields.update(overrides)
    return CreationPlan(**fields)


# One changed value per field; the set of keys must cover every field.
CHANGED = {
    "workspace_id": uuid.UUID("99999999-8888-7777-6666-555555555555"),
    "external_id": None,
    "identifier": "KAN-8",
    "title": "Fix logout",
    "description": "more",
    "workflow": "other",
    "workflow_step": "review",
    "repositories": ["app", "lib"],
    "attachments": ["att-1"],
    "start_agent": True,
    "agent_profile": "default",
    "parent_id": uuid.UUID("3f0c0a7e-0000-4000-8000-000000000002"),
    "repository_paths": {"app": "/srv/elsewhere"},
    "wip_limit": 3,
    "steps": ["branch"],
    "started_by_run": "3f0c0a7e-0000-5000-8000-000000000003",
}


def test_changed_values_cover_every_plan_field() -> None:
    assert set(CHANGED) == {f.name for f in dataclasses.fields(CreationPlan)}


def test_plan_hash_is_stable_for_equal_plans() -> None:
    first = make_plan()
    second = make_plan(
        repositories=["app"], repository_paths={"app": "/srv/app"}, steps=["branch", "worktree"]
    )
    assert first == second
    assert first is not second
    assert first.plan_hash == second.plan_hash
    assert first.plan_hash == first.plan_hash


def test_plan_hash_is_a_sha256_hex_digest() -> None:
    digest = make_plan().plan_hash
    assert len(digest) == 64
    assert int(digest, 16) >= 0


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_plan_hash_changes_when_any_field_changes(name: str) -> None:
    base = make_plan()
    changed = dataclasses.replace(base, **{name: CHANGED[name]})
    assert changed != base
    assert changed.plan_hash != base.plan_hash


def test_plan_hash_depends_on_list_order() -> None:
    assert make_plan(steps=["a", "b"]).plan_hash != make_plan(steps=["b", "a"]).plan_hash


def test_plan_hash_distinguishes_nfc_from_nfd_external_ids() -> None:
    assert (
        make_plan(external_id="caf\u00e9").plan_hash
        != make_plan(external_id="cafe\u0301").plan_hash
    )


def test_manifest_is_json_and_carries_every_field() -> None:
    parent = uuid.uuid4()
    manifest = make_plan(parent_id=parent).to_manifest()
    assert json.loads(json.dumps(manifest)) == manifest
    assert manifest["workspace_id"] == str(WORKSPACE)
    assert manifest["parent_id"] == str(parent)
    # started_by_run only when a run asked: other plans keep their manifest.
    assert set(manifest) == {f.name for f in dataclasses.fields(CreationPlan)} - {
        "started_by_run"
    }
    by_run = make_plan(started_by_run="run-1").to_manifest()
    assert set(by_run) == {f.name for f in dataclasses.fields(CreationPlan)}
    assert by_run["started_by_run"] == "run-1"


plans = st.builds(
    make_plan,
    external_id=st.one_of(st.none(), st.text(max_size=8)),
    identifier=st.sampled_from(["KAN-1", "KAN-2"]),
    title=st.text(min_size=1, max_size=8),
    description=st.text(max_size=4),
    workflow_step=st.sampled_from(["backlog", "review"]),
    repositories=st.lists(st.sampled_from(["app", "lib"]), max_size=2),
    attachments=st.lists(st.sampled_from(["a1", "a2"]), max_size=2),
    start_agent=st.booleans(),
    agent_profile=st.one_of(st.none(), st.just("default"), st.just("None")),
    parent_id=st.one_of(st.none(), st.just(uuid.UUID(int=1)), st.just(uuid.UUID(int=2))),
    repository_paths=st.dictionaries(
        st.sampled_from(["app", "lib"]), st.sampled_from(["/srv/a", "/srv/b"]), max_size=2
    ),
    wip_limit=st.one_of(st.none(), st.integers(min_value=0, max_value=2)),
    steps=st.lists(st.sampled_from(["branch", "worktree", "session"]), max_size=3),
)


@given(plans, plans)
def test_plan_hash_is_equal_exactly_when_plans_are_equal(
    left: CreationPlan, right: CreationPlan
) -> None:
    assert (left.plan_hash == right.plan_hash) == (left == right)
