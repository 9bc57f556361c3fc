"""Response schemas: the OpenAPI contract comes from these, so it cannot drift."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

# The create answer's schema lives beside CreateResult, which builds it.
from kandev_es.creation.outcomes import CreateTaskResponseSchema as CreateTaskResponseSchema
from kandev_es.limits import MAX_CURSOR
from kandev_es.services.tasks import TaskPatchSchema

# The one task representation lives in views.py; re-exported for the routes.
from kandev_es.views import TaskSchema as TaskSchema


class ApiErrorSchema(Schema):
    error = fields.String(required=True, metadata={"description": "machine-readable code"})
    message = fields.String()
    details = fields.Dict()


class ReleaseResponseSchema(TaskSchema):
    released = fields.Boolean(required=True)
    operation_id = fields.String(required=True)
    released_external_id = fields.String(required=True)
    creation_complete = fields.Boolean(required=True)


class LookupResponseSchema(TaskSchema):
    creation_complete = fields.Boolean(required=True)


class TaskListSchema(Schema):
    items = fields.List(fields.Nested(TaskSchema), required=True)
    next_cursor = fields.Integer(allow_none=True, required=True)


class TaskListQuerySchema(Schema):
    external_id = fields.String()
    after = fields.Integer(load_default=0, validate=validate.Range(min=0, max=MAX_CURSOR))
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=500))
    include_archived = fields.Boolean(load_default=True)


class TaskPatchRequestSchema(TaskPatchSchema):
    """The PATCH body as published: the schema the task service validates it
    with (its limits, unknown fields refused), under its OpenAPI name."""


class WorkspaceDeletionSchema(Schema):
    workspace_id = fields.UUID(required=True)
    deletion_generation = fields.Integer(required=True)
    tasks_removed = fields.Integer(required=True)


class WorkspaceCreateSchema(Schema):
    name = fields.String(required=True)
    task_prefix = fields.String(load_default="KAN")


class TokenCreateSchema(Schema):
    workspace_id = fields.UUID()
    admin = fields.Boolean(load_default=False)
    label = fields.String(load_default="")
    role = fields.String(
        load_default="member",
        validate=validate.OneOf(["member", "operator"]),
        metadata={"description": "workspace tokens: member, or operator (release, "
                  "repositories, policy, workspace deletion, task deletion)"},
    )


class TokenSchema(Schema):
    token = fields.String(required=True, metadata={"description": "shown once; stored hashed"})
    admin = fields.Boolean(required=True)
    workspace_id = fields.UUID(allow_none=True)
    role = fields.String(required=True)


class TokenInfoSchema(Schema):
    """A listed token: never its secret or its hash."""

    id = fields.UUID(required=True)
    role = fields.String(
        required=True,
        metadata={"description": "admin, operator, member, or run (a run credential)"},
    )
    workspace_id = fields.UUID(allow_none=True)
    label = fields.String(required=True)
    run_id = fields.String(allow_none=True)
    created_on = fields.DateTime(required=True)
    revoked = fields.Boolean(required=True)


class TokenListSchema(Schema):
    tokens = fields.List(fields.Nested(TokenInfoSchema), required=True)


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ok"]))
    # kandev_es.__version__, as `kandev-es --version` prints it.
    version = fields.String(required=True)


class ReadinessSchema(Schema):
    """/readyz: 200 when ready, 503 (same body) when not."""

    status = fields.String(required=True, validate=validate.OneOf(["ready", "unready"]))
    backend = fields.String(required=True, validate=validate.OneOf(["sqlite", "postgres"]))
    schema_attested = fields.Boolean(required=True)
    external_id_traffic = fields.String(
        required=True, validate=validate.OneOf(["accepted", "refused"])
    )
    schema_problems = fields.List(fields.String())
    projection_lag = fields.Dict(
        keys=fields.String(), values=fields.Integer(), metadata={"description": "events behind"}
    )
    store_error = fields.String()
    durability = fields.Nested(
        "DurabilitySchema",
        metadata={"description": "PostgreSQL only: does a commit wait for a synchronous standby"},
    )


class DurabilitySchema(Schema):
    synchronous_commit = fields.String(required=True)
    synchronous_standby_names = fields.String(required=True)
    synchronous_standbys = fields.Integer(
        required=True, allow_none=True,
        metadata={"description": "null: the role may not read pg_stat_replication.sync_state"},
    )
    durable = fields.Boolean(required=True, allow_none=True)
