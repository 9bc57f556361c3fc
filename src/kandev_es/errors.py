"""The one error hierarchy. Each failure is a class with an HTTP status and a
machine-readable code; adapters map it once (api/errors.py, mcp)."""

from __future__ import annotations

from typing import Any


class KandevError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class BadRequest(KandevError):
    status = 400
    code = "bad_request"


class MalformedJson(BadRequest):
    code = "malformed_json"


class MalformedQuery(BadRequest):
    """The query string is not UTF-8 once percent-decoded."""

    code = "malformed_query"


class InvalidExternalId(BadRequest):
    code = "invalid_external_id"


class ExternalIdImmutable(BadRequest):
    code = "external_id_immutable"


class InvalidCursor(BadRequest):
    """A feed cursor (``after``, ``Last-Event-ID``) or page size is not usable."""

    code = "invalid_cursor"


class ValidationFailed(KandevError):
    """Request-specific validation (title, workflow, references) failed."""

    status = 422
    code = "validation_failed"


class RepositoryNotAllowed(ValidationFailed):
    """A repository path outside KANDEV_REPOSITORY_ROOTS (symlinks resolved)."""

    code = "repository_not_allowed"


class UnknownReference(ValidationFailed):
    code = "unknown_reference"


class OperatorRequired(KandevError):
    """A member token on a route that needs an operator of that workspace."""

    status = 403
    code = "operator_required"


class NotFound(KandevError):
    status = 404
    code = "not_found"


class TaskNotCreated(NotFound):
    """Create denied before validation: unknown workspace or wrong token. The body
    is fixed so a caller cannot learn whether any task exists."""

    code = "task not created"

    def to_dict(self) -> dict[str, Any]:
        return {"error": "task not created"}


class TaskNotFound(NotFound):
    code = "task not found"

    def to_dict(self) -> dict[str, Any]:
        return {"error": "task not found"}


class WorkspaceNotFound(NotFound):
    code = "workspace not found"

    def to_dict(self) -> dict[str, Any]:
        return {"error": "workspace not found"}


class TokenNotFound(NotFound):
    """No token has that id (``token revoke``, ``DELETE /api/v1/tokens/<id>``)."""

    code = "token_not_found"


class IdentityNotFound(NotFound):
    code = "identity not found"

    def to_dict(self) -> dict[str, Any]:
        return {"error": "identity not found"}


class Conflict(KandevError):
    status = 409
    code = "conflict"


class Contended(Conflict):
    """Optimistic concurrency gave up: the records kept changing under every
    bounded attempt (``Tasks.retry_on_conflict``). Retrying later is safe."""


class WorkspaceExists(Conflict):
    code = "workspace_exists"


class RevisionMismatch(KandevError):
    status = 412
    code = "revision_mismatch"


class PayloadTooLarge(KandevError):
    status = 413
    code = "payload_too_large"


class Unavailable(KandevError):
    status = 503
    code = "unavailable"


class StreamLimitReached(Unavailable):
    """Too many open SSE streams on this worker or for this token."""

    code = "stream_limit_reached"


class SchemaNotAttested(Unavailable):
    """External-ID traffic is refused until the live schema proves byte-exact
    collation (AC-1)."""

    code = "schema_not_attested"


class StoreUnavailable(Unavailable):
    code = "store_unavailable"


class UnknownStep(Unavailable):
    """A stored creation plan names a step this version cannot build (a newer
    version planned it): the creation is left for a runtime that knows it."""

    code = "unknown_step"


class InvalidSetting(KandevError):
    """An environment setting that does not parse (KANDEV_POOL_SIZE=abc); the
    CLI reports it as a usage error (exit 2)."""

    code = "invalid_setting"
