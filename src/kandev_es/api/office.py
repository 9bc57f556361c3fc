"""Office runtime actions: an agent creates tasks with its run credential.

Authenticated by the bearer run token issued at agent launch plus
``X-Kandev-Run-Id`` equal to the run it is bound to; a workspace token is not a
run credential. The body goes to the one create protocol unchanged, except the
fields the route owns (a subtask's parent and workspace). A subtask never
inherits its parent's external_id: the route copies nothing from the parent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint

from kandev_es.api.context import RUN_ID_HEADER, json_object, run_principal, services
from kandev_es.api.errors import document_errors
from kandev_es.creation.outcomes import CreateTaskResponseSchema
from kandev_es.creation.placement import Placement, under_parent
from kandev_es.creation.request import CreateTaskRequestSchema
from kandev_es.domain.principal import Principal
from kandev_es.observability import tracing

blp = Blueprint(
    "office", __name__, url_prefix="/api/v1/office/runtime", description="Office runtime"
)

RUN_CREATE_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": RUN_ID_HEADER,
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "the run id the bearer run credential is bound to",
        }
    ],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": CreateTaskRequestSchema}},
    },
}


RUN_CREATE_DESCRIPTION = (
    "The one create protocol, as `POST /api/v1/tasks`: the same body, outcomes and "
    "answers. Authenticated by the agent run's credential (`KANDEV_RUN_TOKEN` as the "
    "bearer) plus `X-Kandev-Run-Id`; anything else gets 404 `task not created` and "
    "writes nothing. 429 when the run's or the workspace's agents are at their limit."
)


def document_run_create(target: Blueprint, summary: str) -> Callable[[Any], Any]:
    """The OpenAPI of a run-authenticated create: same body and answers as REST."""

    def decorate(view: Any) -> Any:
        view = document_errors(target, 400, 404, 409, 413, 422, 429, 502, 503)(view)
        view = target.response(200, CreateTaskResponseSchema)(view)
        return target.doc(
            summary=summary, description=RUN_CREATE_DESCRIPTION, **RUN_CREATE_DOC
        )(view)

    return decorate


def create_as_run(
    body: dict[str, Any], caller: Principal | None = None, placed: Placement | None = None
) -> dict[str, Any]:
    """The create protocol as the calling run; no run credential means the
    protocol's own refusal (404 task not created), before any validation."""
    found = caller if caller is not None else run_principal()
    result = services().creation.create(found, body, placed)
    with tracing.span("answer"):
        return result.to_response()


@blp.route("/tasks")
class RuntimeTaskCreate(MethodView):
    @document_run_create(blp, "Create a root task as an agent run, idempotent by external_id")
    def post(self) -> dict[str, Any]:
        return create_as_run(json_object())


@blp.route("/tasks/<task_id>/subtasks")
class RuntimeSubtaskCreate(MethodView):
    @document_run_create(blp, "Create a subtask of task_id as an agent run (parent's workspace)")
    def post(self, task_id: str) -> dict[str, Any]:
        body = json_object()
        body["parent_id"] = task_id  # invalid, unknown or foreign: reported after the lookup
        body.pop("workspace_id", None)  # the parent's decides (creation/placement.py)
        caller = run_principal()
        return create_as_run(body, caller, under_parent(services().app, caller, task_id))
