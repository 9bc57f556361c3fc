"""A Hypothesis state machine drives create / lookup / release (replays too) /
delete / archive over REST for a handful of external IDs against a model of
who holds each ID, on both backends (AC-TASKS-EXTERNAL-ID-001.1, .3, .6).

After every step: at most one live task (loaded from the event store) holds
each ID, and it is the one the model expects. At teardown: after
``projections.catch_up()`` every tasks_view row of the workspace equals the
DTO the event store replays for that task, and no live task is missing."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kandev_es.api import create_app
from kandev_es.domain.task import Task
from kandev_es.views import task_dto
from tests.conftest import bearer
from tests.support.errors import without_request_id

EXTERNAL_IDS = ["JIRA-1", "JIRA-2", "jira-1", "  JIRA-1  ", "hook-\u00e9"]
BOUNDS = settings(
    max_examples=10,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)


def canonical(external_id: str) -> str:
    return external_id.strip()


def machine_for(services: Any) -> type[RuleBasedStateMachine]:
    client = create_app(services=services, run_projections=False).test_client()
    secret, _ = services.tokens.issue(workspace_id=None, admin=True)
    headers = bearer(secret)

    class IdentityModel(RuleBasedStateMachine):
        operations = Bundle("operations")

        def __init__(self) -> None:
            super().__init__()
            self.workspace = services.workspaces.open(f"sm-{uuid.uuid4().hex[:10]}", "SM")
            self.holders: dict[str, str] = {}  # canonical external ID -> task id
            self.tasks: set[str] = set()  # every task created here
            self.deleted: set[str] = set()

        def lookup_path(self, external_id: str) -> str:
            return f"/api/v1/workspaces/{self.workspace.id}/tasks/by-external-id"

        @rule(external_id=st.sampled_from(EXTERNAL_IDS), title=st.text(max_size=5))
        def create(self, external_id: str, title: str) -> None:
            body = {"workspace_id": str(self.workspace.id), "external_id": external_id,
                    "title": title}
            reply = client.post("/api/v1/tasks", json=body, headers=headers)
            key = canonical(external_id)
            if key in self.holders:  # Found answers before validating the title
                assert reply.status_code == 200, reply.get_json()
                assert reply.get_json()["outcome"] == "found_settled"
                assert reply.get_json()["id"] == self.holders[key]
            elif not title.strip():
                assert reply.status_code == 422, reply.get_json()
            else:
                assert reply.status_code == 200, reply.get_json()
                answer = reply.get_json()
                assert answer["outcome"] == "created" and answer["external_id"] == key
                self.holders[key] = answer["id"]
                self.tasks.add(answer["id"])

        @rule(external_id=st.sampled_from(EXTERNAL_IDS))
        def lookup(self, external_id: str) -> None:
            reply = client.get(
                self.lookup_path(external_id), query_string={"external_id": external_id},
                headers=headers,
            )
            key = canonical(external_id)
            if key in self.holders:
                assert reply.status_code == 200, reply.get_json()
                assert reply.get_json()["id"] == self.holders[key]
                assert reply.get_json()["creation_complete"] is True
            else:
                assert reply.status_code == 404, reply.get_json()

        @rule(target=operations, external_id=st.sampled_from(EXTERNAL_IDS))
        def release(self, external_id: str) -> tuple[str, str, int, Any]:
            operation = f"op-{uuid.uuid4()}"
            reply = client.delete(
                self.lookup_path(external_id), query_string={"external_id": external_id},
                headers={**headers, "Idempotency-Key": operation},
            )
            key = canonical(external_id)
            if key in self.holders:
                assert reply.status_code == 200, reply.get_json()
                assert reply.get_json()["id"] == self.holders.pop(key)
            else:
                assert reply.status_code == 404, reply.get_json()
            assert reply.headers["Idempotent-Replayed"] == "false"
            return external_id, operation, reply.status_code, reply.get_json()

        @rule(done=operations)
        def replay_release(self, done: tuple[str, str, int, Any]) -> None:
            external_id, operation, status, body = done
            reply = client.delete(
                self.lookup_path(external_id), query_string={"external_id": external_id},
                headers={**headers, "Idempotency-Key": operation},
            )
            assert reply.status_code == status
            if status == 200:
                assert reply.get_json() == body  # the stored result, as it was
            else:  # an error is answered anew, under this request's own id
                assert without_request_id(reply.get_json()) == without_request_id(body)
            assert reply.headers["Idempotent-Replayed"] == "true"
            # the model is untouched: a later holder keeps its identity (invariant)

        @rule(external_id=st.sampled_from(EXTERNAL_IDS))
        def archive(self, external_id: str) -> None:
            task_id = self.holders.get(canonical(external_id))
            if task_id is None:
                return
            reply = client.post(f"/api/v1/tasks/{task_id}/archive", headers=headers)
            assert reply.status_code == 200, reply.get_json()
            assert reply.get_json()["archived"] is True

        @rule(external_id=st.sampled_from(EXTERNAL_IDS))
        def delete(self, external_id: str) -> None:
            task_id = self.holders.get(canonical(external_id))
            if task_id is None:
                return
            reply = client.delete(f"/api/v1/tasks/{task_id}", headers=headers)
            assert reply.status_code == 204, reply.get_data(as_text=True)
            del self.holders[canonical(external_id)]
            self.deleted.add(task_id)
            assert client.get(f"/api/v1/tasks/{task_id}", headers=headers).status_code == 404

        @rule(task=consumes(operations))
        def forget_operation(self, task: tuple[str, str, int, Any]) -> None:
            """Lets the bundle shrink; replays stay possible for the rest."""

        @invariant()
        def at_most_one_live_holder_per_id(self) -> None:
            holding: dict[str, list[str]] = {}
            for task_id in self.tasks:
                task = services.app.load(uuid.UUID(task_id), Task)
                assert task is not None
                dto = task_dto(task)
                if task_id in self.deleted or "external_id" not in dto:
                    continue
                holding.setdefault(dto["external_id"], []).append(task_id)
            assert {k: v for k, v in holding.items()} == {
                k: [v] for k, v in self.holders.items()
            }

        def teardown(self) -> None:
            services.projections.catch_up()
            with services.database.transaction() as tx:
                rows = tx.execute(
                    "SELECT task_id, dto FROM tasks_view WHERE workspace_id = ?",
                    (str(self.workspace.id),),
                )
            view = {str(uuid.UUID(str(task_id))): json.loads(dto) for task_id, dto in rows}
            live = self.tasks - self.deleted
            assert set(view) == live
            for task_id in live:
                task = services.app.load(uuid.UUID(task_id), Task)
                assert task is not None
                assert view[task_id] == json.loads(json.dumps(task_dto(task))), task_id

    return IdentityModel


def test_model_of_create_lookup_release_delete_archive_matches_store_and_read_models(services):
    run_state_machine_as_test(machine_for(services), settings=BOUNDS)
