"""Request helpers shared by blueprints: services, principal, the JSON body and
its loading by a schema, the admin check."""

from __future__ import annotations

import uuid
from typing import Any, cast

from flask import current_app, request

from kandev_es.bootstrap import Services
from kandev_es.domain.principal import Principal, Unconfirmed
from kandev_es.errors import (
    BadRequest,
    KandevError,
    MalformedJson,
    ValidationFailed,
    WorkspaceNotFound,
)
from kandev_es.limits import parse_json_body
from kandev_es.services.auth import bearer_of

EXTENSION_KEY = "kandev_es"


def services() -> Services:
    return cast(Services, current_app.extensions[EXTENSION_KEY])


RUN_ID_HEADER = "X-Kandev-Run-Id"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


def idempotency_key_parameter(
    description: str, required: bool = True, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``Idempotency-Key`` header as an OpenAPI parameter of a route that
    takes one (what the key names differs by route; the header does not)."""
    return {
        "name": IDEMPOTENCY_KEY_HEADER,
        "in": "header",
        "required": required,
        "schema": {"type": "string", **(schema or {})},
        "description": description,
    }


def idempotency_key() -> str | None:
    """This request's ``Idempotency-Key``, as sent (the service checks it)."""
    return request.headers.get(IDEMPOTENCY_KEY_HEADER)


def replayed_header(replayed: bool) -> dict[str, str]:
    """``Idempotent-Replayed``: whether the answer is a stored one."""
    return {REPLAYED_HEADER: "true" if replayed else "false"}


def bearer_secret() -> str | None:
    """This request's bearer secret; any other scheme, or none, is None."""
    return bearer_of(request.headers.get("Authorization", ""))


def run_id_header() -> str | None:
    """The ``X-Kandev-Run-Id`` a run credential is presented with, as sent."""
    return request.headers.get(RUN_ID_HEADER)


def principal() -> Principal | None:
    secret = bearer_secret()
    return services().tokens.authenticate(secret) if secret is not None else None


def create_principal() -> Principal | Unconfirmed | None:
    """For the create route only: CreationService.create confirms the token
    in its own first query (one round trip fewer per create)."""
    secret = bearer_secret()
    return services().tokens.authenticate_unconfirmed(secret) if secret is not None else None


def run_principal() -> Principal | None:
    """The run credential of an agent: its bearer token plus ``X-Kandev-Run-Id``
    equal to the run the token is bound to. Anything else is no principal."""
    secret = bearer_secret()
    if secret is None:
        return None
    return services().tokens.authenticate_run(secret, run_id_header())


def own_task_principal(task_id: uuid.UUID) -> Principal | None:
    """A run credential may read its own run's task, and nothing else."""
    found = run_principal()
    return found if found is not None and found.task_id == task_id else None


def json_object(unique_keys: bool = False) -> dict[str, Any]:
    """Parse the body ourselves (limits.parse_json_body: depth, storable text,
    finite numbers), without validating its fields: the protocol reads only
    workspace_id and external_id before the lookup (AC-4). ``unique_keys``:
    an object naming a key twice is refused."""
    raw = request.get_data(cache=True)
    body = parse_json_body(raw, unique_keys) if raw else None
    if not isinstance(body, dict):
        raise MalformedJson("request body must be a JSON object")
    return body


def path_uuid(value: str, what: str = "id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"{what} must be a UUID") from None


def path_workspace(value: str, unseen: KandevError) -> uuid.UUID:
    """A workspace in a path, by id or by name (the live workspace of that name,
    as the CLI's ``--workspace`` takes it). Asked by nobody, or of a name no
    workspace has, it raises ``unseen``: the route's not-found answer, the
    same one an unauthorized caller gets, so a name reveals nothing."""
    try:
        return uuid.UUID(value)
    except ValueError:
        pass
    if principal() is None:
        raise unseen
    named = services().workspaces.get_by_name(value)
    if named is None:
        raise unseen
    return named.id


def require_admin() -> Principal:
    """The admin principal; anyone else gets the same 404 as for an unknown
    workspace, learning nothing, not even that the route is admin-only."""
    who = principal()
    if who is None or not who.admin:
        raise WorkspaceNotFound("workspace not found")
    return who


def load_body(schema: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` loaded by ``schema`` (a class); a refusal is 422 with its messages."""
    from marshmallow import ValidationError

    try:
        loaded: dict[str, Any] = schema().load(body)
    except ValidationError as error:
        raise ValidationFailed("invalid request", fields=error.messages) from None
    return loaded
