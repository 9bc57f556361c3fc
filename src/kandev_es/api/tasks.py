"""Task routes: create (the protocol), lookup, get, list, patch, archive, delete,
forget."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from flask import Response, current_app, jsonify, request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields, validate

from kandev_es.api.answers import create_answer
from kandev_es.api.context import (
    create_principal,
    idempotency_key,
    idempotency_key_parameter,
    json_object,
    own_task_principal,
    path_uuid,
    path_workspace,
    principal,
    replayed_header,
    services,
)
from kandev_es.api.errors import document_errors
from kandev_es.bulk.request import BatchCreateRequestSchema
from kandev_es.bulk.results import BatchCreateResponseSchema, BatchResult
from kandev_es.creation.outcomes import CreateTaskResponseSchema
from kandev_es.creation.request import CreateTaskRequestSchema
from kandev_es.domain.external_id import normalize_external_id, require_external_id
from kandev_es.domain.principal import require_operator
from kandev_es.errors import BadRequest, TaskNotFound, http_status
from kandev_es.limits import MAX_CURSOR, MAX_LIST_LIMIT, stored_integer
from kandev_es.observability import tracing
from kandev_es.observability.serving import with_request_id
from kandev_es.services.release import NO_HOLDER
from kandev_es.services.tasks import TaskPatchSchema
from kandev_es.views import TaskSchema, task_dto

blp = Blueprint("tasks", __name__, url_prefix="/api/v1", description="Tasks")

# The task representation is views.TaskSchema; these are this blueprint's own.
class ReleaseResponseSchema(TaskSchema):
    released = fields.Boolean(required=True)
    operation_id = fields.String(required=True)
    released_external_id = fields.String(required=True)
    creation_complete = fields.Boolean(required=True)


class ForgetRequestSchema(Schema):
    reason = fields.String(
        required=True,
        metadata={
            "description": "why (1-500 characters, one line), recorded in the Forgotten"
            " event: never the values being erased",
            "example": "GDPR art. 17 request 2026-118",
        },
    )


class ForgetResponseSchema(Schema):
    task_id = fields.UUID(required=True)
    forgotten = fields.Boolean(required=True)
    operation_id = fields.String(required=True, metadata={"description": "the first forget's"})
    actor = fields.String(required=True, metadata={"description": "who forgot it"})
    revision = fields.Integer(required=True)
    reason = fields.String(metadata={"description": "this call's reason; absent on a replay"})


class LookupResponseSchema(TaskSchema):
    creation_complete = fields.Boolean(required=True)


class TaskListSchema(Schema):
    items = fields.List(
        fields.Nested(TaskSchema), required=True, metadata={"description": "in creation order"}
    )
    next_cursor = fields.Integer(
        allow_none=True,
        required=True,
        metadata={"description": "pass back as `after` for the next page; null on the last"},
    )
    has_more = fields.Boolean(
        required=True, metadata={"description": "another page follows (next_cursor is not null)"}
    )


class TaskListQuerySchema(Schema):
    external_id = fields.String(
        metadata={"description": "only the task holding this external ID (none: an empty page)"}
    )
    after = fields.Integer(
        load_default=0,
        validate=validate.Range(min=0, max=MAX_CURSOR),
        metadata={
            "description": "cursor: the tasks after it; 0 (default) for the first page, "
            "then the previous page's `next_cursor`"
        },
    )
    limit = fields.Integer(
        load_default=50,
        validate=validate.Range(min=1, max=MAX_LIST_LIMIT),
        metadata={"description": f"most tasks on the page (1-{MAX_LIST_LIMIT}, default 50)"},
    )
    include_archived = fields.Boolean(
        load_default=True, metadata={"description": "false leaves archived tasks out"}
    )


class TaskPatchRequestSchema(TaskPatchSchema):
    """The PATCH body as published: the schema the task service validates it
    with (its limits, unknown fields refused), under its OpenAPI name."""


def _documentation_only(view: Any) -> Any:
    """The view itself, carrying the OpenAPI documentation the flask-smorest
    decorators under this one collected (their ``_apidoc``), without their
    wrappers: a view that returns a finished Response passes through them
    unchanged (flask-smorest returns a Response as is), and on the create
    route they cost about 100 Python calls per request.
    tests/unit/test_library_internals.py checks both."""
    plain = inspect.unwrap(view)
    plain._apidoc = view._apidoc
    return plain


@blp.route("/tasks")
class TaskCreate(MethodView):
    @_documentation_only
    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": CreateTaskRequestSchema}},
        },
    )
    @blp.response(200, CreateTaskResponseSchema)
    @document_errors(blp, 400, 404, 409, 413, 422, 429, 502, 503)
    def post(self) -> Response:  # always a Response: see _documentation_only
        """Create a task, idempotent by external_id

        With an `external_id`, the one task that holds that identity in the workspace
        is answered, whatever the retry: `created` the first time, then
        `found_settled`, or `found_unsettled` while another create still owns it
        (`deduplicated: true`, `creation_complete: false`: use that task, poll the
        lookup, never release and recreate). A held identity is found before the rest
        of the body is validated. Without an `external_id` every call creates a task.
        The workspace is `workspace_id`, else the token's.
        """
        body = json_object()
        result = services().creation.create(create_principal(), body)
        with tracing.span("answer"):
            return create_answer(result)  # the documented schema's dump, built here


@blp.route("/tasks/batch")
class TaskBatch(MethodView):
    @_documentation_only
    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": BatchCreateRequestSchema}},
        },
    )
    @blp.doc(
        parameters=[
            idempotency_key_parameter(
                "optional: the same key again replays the first batch's results "
                "(Idempotent-Replayed: true); with another body 422 "
                "idempotency_key_reused; while the first is processed 409 "
                "batch_in_progress",
                required=False,
                schema={"minLength": 1, "maxLength": 200},
            )
        ],
    )
    @blp.response(200, BatchCreateResponseSchema)
    @document_errors(blp, 400, 404, 409, 413, 422, 503)
    def post(self) -> Response:  # always a Response: see _documentation_only
        """Create many tasks, each idempotent by external_id

        Each item of `tasks` is a single create's body and obeys its protocol: a held
        identity is found before the item is validated, with no side effect; an item
        without `external_id` creates a task; an external ID given twice makes one
        task (the later item answers found). The answer is 200 whatever the items'
        outcomes: one result per item in request order -- the single create's answer
        or the item's typed error, with its `index` and `status` -- and counts by
        outcome. The batch's workspace is authorized before any item is read (404).
        At most `KANDEV_BATCH_MAX_ITEMS` items (413). `atomic: true`: nothing is
        created unless every item would be created or found (422 `batch_refused`
        listing every failing index); items with effects are refused there.
        Retrying a batch is safe by external ID; with the same `Idempotency-Key` it
        replays the first answer.
        """
        body = json_object(unique_keys=True)
        key = idempotency_key()
        result = services().batch.create_many(principal(), body, key)
        answer = _batch_answer(result)
        if key is not None:
            answer.headers.update(replayed_header(result.replayed))
        return answer


def _batch_answer(result: BatchResult) -> Response:
    """The batch's answer, its JSON written item by item as it is sent: a
    1,000-item answer is never one string (nor its bytes) in memory."""
    dumps = current_app.json.dumps
    head = dumps(result.to_response(with_results=False))

    def chunks() -> Iterator[str]:
        yield head[: head.rindex("}")] + ',"results":['  # the head is one object
        for place, item in enumerate(result.items):
            yield ("," if place else "") + dumps(item.to_response())
        yield "]}"

    return current_app.response_class(chunks(), mimetype="application/json")


@blp.route("/workspaces/<workspace_id>/tasks/by-external-id")
class TaskLookup(MethodView):
    @blp.doc(
        parameters=[
            {
                "name": "external_id",
                "in": "query",
                "required": True,
                "schema": {"type": "string"},
                "description": "the external ID to look up (trimmed; at most 255 UTF-8 bytes;"
                " matched byte for byte)",
            }
        ],
    )
    @blp.response(200, LookupResponseSchema)
    @document_errors(blp, 400, 404, 503)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """What holds this external ID? No side effects, ever

        The task that holds the identity, with `creation_complete`: poll this after a
        `found_unsettled` until it is true. 404 when nothing holds it (never
        created, or released), or the workspace is not the token's.
        `workspace_id` is the workspace's id or its name.
        """
        workspace = path_workspace(workspace_id, TaskNotFound("task not found"))
        who = principal()
        if who is None or not who.may_act_on(workspace):
            raise TaskNotFound("task not found")
        external_id = require_external_id(request.args.get("external_id"))
        found = services().creation.lookup(workspace, external_id)
        if found is None:
            raise TaskNotFound("task not found")
        return found.to_lookup_response()

    @blp.doc(
        parameters=[
            {
                "name": "external_id",
                "in": "query",
                "required": True,
                "schema": {"type": "string"},
                "description": "the external ID to release from the task holding it",
            },
            idempotency_key_parameter("the stable release operation id"),
        ],
    )
    @blp.response(200, ReleaseResponseSchema)
    @document_errors(blp, 400, 403, 404, 409, 422, 503)
    def delete(self, workspace_id: str) -> Any:
        """Release an identity (operator), by stable operation id

        A manual operator decision for an abandoned task, never a retry loop's and
        never an answer to `creation_complete: false`. The task stays, without its
        external ID; the next create with it makes a new task (a new tenure). The
        `Idempotency-Key` is the operation id: the same key again answers the stored
        result (`Idempotent-Replayed: true`); reused for another identity, 422.
        `workspace_id` is the workspace's id or its name.
        """
        workspace = path_workspace(workspace_id, TaskNotFound("task not found"))
        who = require_operator(principal(), workspace, TaskNotFound("task not found"))
        result = services().release.release(
            workspace,
            request.args.get("external_id"),
            idempotency_key(),
            actor=who.actor,
        )
        headers = replayed_header(result.replayed)
        if not result.released:  # no holder: the stored answer
            return jsonify(with_request_id(result.body)), http_status(NO_HOLDER), headers
        return result.body, 200, headers


@blp.route("/workspaces/<workspace_id>/tasks")
class TaskList(MethodView):
    @blp.arguments(TaskListQuerySchema, location="query")
    @blp.response(200, TaskListSchema)
    @document_errors(blp, 400, 404, 422)
    def get(self, query: dict[str, Any], workspace_id: str) -> dict[str, Any]:
        """List a workspace's tasks, page by page

        In creation order, `limit` at a time; pass `next_cursor` back as `after` for
        the next page (`null`: no more). `external_id` narrows the list to the task
        holding it; `include_archived=false` leaves archived tasks out.
        """
        workspace = path_uuid(workspace_id, "workspace id")
        who = principal()
        if who is None or not who.may_act_on(workspace):
            raise TaskNotFound("task not found")
        external_id = None
        if "external_id" in query:
            external_id = normalize_external_id(query["external_id"])
        page = services().tasks.list(
            workspace,
            external_id=external_id,
            after=query["after"],
            limit=query["limit"],
            include_archived=query["include_archived"],
        )
        return page.to_dict()


@blp.route("/tasks/<task_id>")
class TaskItem(MethodView):
    @blp.response(200, TaskSchema)
    @document_errors(blp, 400, 404)
    def get(self, task_id: str) -> Any:
        """Get a task

        The task as every entry point shows it, with its revision in `ETag` (send it
        back as `If-Match` on a PATCH). A run credential may read its own task.
        """
        wanted = path_uuid(task_id, "task id")
        task = services().tasks.get(principal() or own_task_principal(wanted), wanted)
        return task_dto(task), 200, {"ETag": f'"{task.revision}"'}

    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": TaskPatchRequestSchema}},
        }
    )
    @blp.response(200, TaskSchema)
    @document_errors(blp, 400, 404, 412, 413, 422)
    def patch(self, task_id: str) -> Any:
        """Update a task's title, description or workflow step

        Only the fields sent change; `external_id` cannot (400
        `external_id_immutable`: release the identity instead). With `If-Match` the
        update applies only to that revision (412 otherwise).
        """
        body = json_object()
        dto = services().tasks.patch(
            principal(), path_uuid(task_id, "task id"), body, _if_match_revision()
        )
        return dto, 200, {"ETag": f'"{dto["revision"]}"'}

    @blp.response(204)
    @document_errors(blp, 400, 403, 404)
    def delete(self, task_id: str) -> None:
        """Delete a task (operator)

        The task is gone from reads and lists, and the identity it held is free: a
        later create with its external ID makes a new task. Its history stays in the
        identity's stream for auditors.
        """
        services().tasks.delete(principal(), path_uuid(task_id, "task id"))


@blp.route("/tasks/<task_id>/archive")
class TaskArchive(MethodView):
    @blp.response(200, TaskSchema)
    @document_errors(blp, 400, 404)
    def post(self, task_id: str) -> dict[str, Any]:
        """Archive a task

        The task stays readable (`archived: true`) and keeps its external ID, so a
        create with it still finds this task; its WIP slot is given back and its
        agent run's credential revoked. No request body.
        """
        return services().tasks.archive(principal(), path_uuid(task_id, "task id"))


@blp.route("/tasks/<task_id>/forget")
class TaskForget(MethodView):
    @blp.doc(
        parameters=[
            idempotency_key_parameter("the stable operation id of this erasure")
        ],
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": ForgetRequestSchema}},
        },
    )
    @blp.response(200, ForgetResponseSchema)
    @document_errors(blp, 400, 403, 404, 409, 422, 503)
    def post(self, task_id: str) -> Any:
        """Forget a task's free text (operator or admin)

        Its title and description are erased from every event of the task and of its
        identity (their data key is deleted: the events, chains, checkpoints and
        proofs stay byte-identical), from the read models and from the feeds; they
        read as `null` and the task as `forgotten: true`. A `Forgotten` event records
        who, when, why and the request. Any task, deleted ones too. Again, with any
        key: the first forget's answer (`Idempotent-Replayed: true`). A task created
        before free text was sealed has its cleartext events rewritten under a
        redaction statement its `Forgotten` events record (docs/auditing.md); one
        whose events the ledger has not logged yet: 409 `conflict`, retry; the
        statement is signed by the ledger's key (unreadable: 503).
        """
        wanted = path_uuid(task_id, "task id")
        body = json_object()
        result = services().forgetting().forget(
            principal(), wanted, body.get("reason"), idempotency_key()
        )
        return result.body, 200, replayed_header(result.replayed)


def _if_match_revision() -> int | None:
    header = request.headers.get("If-Match")
    if not header:
        return None
    revision = stored_integer(header.strip().strip('"'))
    if revision is None:
        raise BadRequest("If-Match must be a task revision")
    return revision
