"""The one error hierarchy: everything kandev_es raises on purpose descends
from ``Failure``.

- ``KandevError``: a failure answered to the caller — one class per failure,
  a machine-readable ``code``, a message and details. All of them are here.
  Each family's HTTP status is in one table at the end (``http_status``);
  the adapters use it (api/errors.py for the response, mcp/errors.py for a
  tool error carrying that status), nothing below them does.
- ``InternalError``: a signal one layer raises and another catches
  (VersionConflict, Fenced, StepFailed, DomainRuleBroken, ...). Each stays in
  the module of the layer that raises it; one that escapes is answered as a
  bare 500 internal_error, its message never shown.

Outside it on purpose: client.py's errors (the caller's side of the wire),
click's exceptions in the CLI, and the failpoint that stands for an error no
code knows (creation/failpoints.py)."""

from __future__ import annotations

from typing import Any


class Failure(Exception):
    """The root."""


class InternalError(Failure):
    """Raised and caught between layers; never a caller's answer as itself."""


class KandevError(Failure):
    """A failure answered to the caller."""

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
    code = "bad_request"


class MalformedJson(BadRequest):
    code = "malformed_json"


class InvalidText(BadRequest):
    """A string in the request that cannot be stored as text: a lone surrogate
    (no UTF-8 encoding) or NUL (PostgreSQL text, paths, argv and environment
    cannot hold it). ``details.field`` names where it was."""

    code = "invalid_text"


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


class MissingOperationId(BadRequest):
    """A release without a usable ``Idempotency-Key`` (its operation id)."""

    code = "idempotency_key_required"


class InvalidBatch(BadRequest):
    """A batch of creates whose envelope is unusable: ``tasks`` not a list, an
    item that is not an object, a key given twice, a field the batch does not
    take. Refused whole, before any item is read (``details`` says where)."""

    code = "invalid_batch"


class UnknownProjection(BadRequest):
    code = "unknown_projection"


class NotRebuildable(BadRequest):
    code = "projection_not_rebuildable"


class InvalidCheckpointRange(BadRequest):
    """A consistency proof asked between sizes that are not 0 < from <= to."""

    code = "invalid_checkpoint_range"


class ValidationFailed(KandevError):
    """Request-specific validation (title, workflow, references) failed."""

    code = "validation_failed"


class InvalidPath(ValidationFailed):
    """A path the operating system cannot take: a component longer than 255
    bytes, or the whole longer than 4096."""

    code = "invalid_path"


class RepositoryNotAllowed(ValidationFailed):
    """A repository path outside KANDEV_REPOSITORY_ROOTS (symlinks resolved)."""

    code = "repository_not_allowed"


class RepositoryNotTopLevel(ValidationFailed):
    """A repository path that is not the top of its own git work tree (a folder
    inside an enclosing repository): git commands there would act on the
    enclosing repository."""

    code = "repository_not_top_level"


class UnknownReference(ValidationFailed):
    code = "unknown_reference"


class OperationIdReused(ValidationFailed):
    """A release operation id already used to release another identity."""

    code = "operation_id_reused"


class BatchRefused(ValidationFailed):
    """An atomic batch of creates in which some item would not be created or
    found: nothing was created; ``details.failures`` lists every failing index
    with its error."""

    code = "batch_refused"


class EffectsInAtomicBatch(ValidationFailed):
    """An item with effects (repositories, attachments, start_agent, or a
    workspace WIP limit: durable steps) in an atomic batch, which saves its
    items in one transaction and so can run no step."""

    code = "effects_in_atomic_batch"


class IdempotencyKeyReused(ValidationFailed):
    """An ``Idempotency-Key`` already used for a batch with another body."""

    code = "idempotency_key_reused"


class InvalidWebhookUrl(ValidationFailed):
    """A webhook URL that is not an absolute ``https`` URL (``http`` only with
    KANDEV_WEBHOOK_ALLOW_HTTP), has credentials in it, or whose host does not
    resolve."""

    code = "invalid_webhook_url"


class WebhookAddressRefused(ValidationFailed):
    """A webhook URL whose host is (or resolves to) a loopback, private,
    link-local, CGNAT, multicast, reserved or cloud-metadata address not in
    KANDEV_WEBHOOK_ALLOW_NETWORKS (docs/webhooks.md: SSRF)."""

    code = "webhook_address_refused"


class UnknownEventType(ValidationFailed):
    """A subscription to an event type the feeds do not publish."""

    code = "unknown_event_type"


class Unauthenticated(KandevError):
    """No bearer token that authenticates, where the transport refuses the
    request itself before any state (MCP over HTTP: no session, no transport)."""

    code = "unauthenticated"


class MethodNotAllowed(KandevError):
    """A method the route does not offer (MCP over HTTP: only POST; it keeps no
    sessions, so no GET stream and no DELETE)."""

    code = "method_not_allowed"


class OperatorRequired(KandevError):
    """A member token on a route that needs an operator of that workspace."""

    code = "operator_required"


class NotFound(KandevError):
    code = "not_found"


# A refused create's message when a bearer token was sent: the same words for
# a token unknown, revoked or of another workspace, a workspace that does not
# exist and one deleted, so the answer discloses nothing (the caller's own
# credential missing or malformed is said apart: services/auth.py).
NOT_VALID_FOR_WORKSPACE = (
    "the bearer token is not valid for the workspace this request names"
    " (a workspace that does not exist is answered the same)"
)


class TaskNotCreated(NotFound):
    """Create denied before validation: unknown workspace or wrong token. The
    body is fixed, its message one of a few fixed texts, so a caller cannot
    learn whether any task or workspace exists."""

    code = "task not created"

    def __init__(self, message: str = NOT_VALID_FOR_WORKSPACE) -> None:
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        return {"error": "task not created", "message": self.message}


class WorkspaceDeleted(TaskNotCreated):
    """The workspace was deleted while the creation was in flight: answered
    exactly as a create the workspace refused."""


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


class WebhookNotFound(NotFound):
    code = "webhook_not_found"


class CheckpointNotFound(NotFound):
    """No signed checkpoint of that size (or none yet: the ledger's sequencer
    has not caught up; docs/auditing.md)."""

    code = "checkpoint_not_found"


class CreationNotFound(NotFound):
    """A creation handle that is malformed, unknown, or not the caller's."""

    code = "creation not found"

    def to_dict(self) -> dict[str, Any]:
        return {"error": "creation not found"}


class Conflict(KandevError):
    code = "conflict"


class Contended(Conflict):
    """Optimistic concurrency gave up: the records kept changing under every
    bounded attempt (``Tasks.retry_on_conflict``). Retrying later is safe."""


class BatchInProgress(Conflict):
    """A batch with this ``Idempotency-Key`` is still being processed; retry
    with the same key once it ends (its answer is then replayed)."""

    code = "batch_in_progress"


class WorkspaceExists(Conflict):
    code = "workspace_exists"


class ReleaseConflict(Conflict):
    """The creation is in phase B (completing/aborting): release must wait."""

    code = "release_conflict"


class TaskForgotten(Conflict):
    """A forgotten task's title or description cannot be written again."""

    code = "task_forgotten"


class CreationNotParked(Conflict):
    """An operator settles only creations the Runtime has given up on (parked);
    an aborted one only while it has not begun completing."""

    code = "creation_not_parked"


class CreationInProgress(Conflict):
    """Callers never repair, edit or delete a task whose creation is unsettled."""

    code = "creation_in_progress"


class BranchTaken(Conflict):
    code = "branch_exists"


class CapacityExceeded(Conflict):
    """The workspace's WIP limit has no room for another task."""

    code = "capacity_exhausted"


class AttachmentClaimed(Conflict):
    code = "attachment_claimed"


class WebhookPaused(Conflict):
    """A paused subscription is not replayed: resume it first."""

    code = "webhook_paused"


class WebhookLimitReached(Conflict):
    """A workspace has as many webhook subscriptions as it may."""

    code = "webhook_limit_reached"


class RevisionMismatch(KandevError):
    code = "revision_mismatch"


class PayloadTooLarge(KandevError):
    code = "payload_too_large"


class BatchTooLarge(PayloadTooLarge):
    """A batch of creates with more items than KANDEV_BATCH_MAX_ITEMS
    (``details.max_items``) or more bytes than KANDEV_BATCH_MAX_BYTES."""

    code = "batch_too_large"


class RequestLineTooLong(KandevError):
    """The request line is over KANDEV_MAX_REQUEST_LINE bytes (the HTTP server's answer)."""

    code = "request_line_too_long"


class HeaderFieldsTooLarge(KandevError):
    """Too many header fields, or one too long (the HTTP server's answer)."""

    code = "header_fields_too_large"


class RequestTimeout(KandevError):
    """A request whose headers or body did not arrive within their time
    (KANDEV_HEADER_TIMEOUT, KANDEV_BODY_TIMEOUT), answered by the HTTP front."""

    code = "request_timeout"


class TransferEncodingUnsupported(KandevError):
    """A Transfer-Encoding the HTTP front does not decode (only chunked is)."""

    code = "not_implemented"


class EffectFailed(KandevError):
    """An effect outside the event store (git, the agent process) failed, or
    could not be proven, so the creation aborted."""

    code = "effect_failed"


class RepositoryEffectFailed(EffectFailed):
    code = "repository_effect_failed"


class AgentLaunchFailed(EffectFailed):
    code = "agent_launch_failed"


class EffectUnproven(EffectFailed):
    code = "effect_unproven"


class CompensationUnproven(EffectFailed):
    """An operator's abort could not remove an effect, even forcibly: the
    creation stays aborting and parked; the abort may be repeated."""

    code = "compensation_unproven"


class TooMany(KandevError):
    """The caller already holds as much as a bound allows; it frees up when
    what it holds ends."""

    code = "too_many"


class AgentLimitReached(TooMany):
    """An agent run may not start another agent: its own running agents, or
    the workspace's running agents started by runs, are at their limit
    (KANDEV_MAX_AGENTS_PER_RUN, KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE)."""

    code = "agent_limit_reached"


class Unavailable(KandevError):
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


class ProjectionFailed(Unavailable):
    """A read model written in the save's transaction refused it: the whole
    save was rolled back, nothing is stored; retrying may succeed."""

    code = "projection_failed"


class SchemaSetupFailed(Unavailable):
    """``db init`` could not create what the store needs (no right to create in
    the database or schema, a data dir it cannot write)."""

    code = "schema_setup_failed"


class CreationHandedOver(Unavailable):
    """A newer epoch (the recovery Runtime) took over the caller's creation."""

    code = "creation_handed_over"


class UnknownTopic(Unavailable):
    """The projection loop met an event of a topic this version does not know
    (written by a newer one): it stops there rather than leave a hole."""

    code = "unknown_topic"


class UnknownStep(Unavailable):
    """A stored creation plan names a step this version cannot build (a newer
    version planned it): the creation is left for a runtime that knows it."""

    code = "unknown_step"


class LedgerRefused(Unavailable):
    """The ledger's sequencer will not sign (docs/auditing.md, "The signer's
    anchor"): the log in the database is not a consistent extension of the
    last checkpoint this host signed (kept beside the key), or the signing key
    that signed it is missing or unreadable. Nothing is signed until an
    operator re-anchors (``audit reanchor``) or rotates the key (``audit
    rotate-key``)."""

    code = "ledger_signing_refused"


class LedgerKeyUnsafe(Unavailable):
    """The checkpoint signing key (or its anchor) can be read by the file's
    group or by others: the server refuses to start with it."""

    code = "ledger_key_unsafe"


class WebhookKeyMissing(Unavailable):
    """This node has no readable webhook signing key (KANDEV_WEBHOOK_KEY_FILE,
    made by ``db init``): it signs no v1a and delivers no webhooks; another
    node that has the deployment's key delivers (docs/webhooks.md)."""

    code = "webhook_key_missing"


class InvalidSetting(KandevError):
    """An environment setting that does not parse (KANDEV_POOL_SIZE=abc); the
    CLI reports it as a usage error (exit 2)."""

    code = "invalid_setting"


# By family: a class answers with the status of its nearest listed ancestor.
HTTP_STATUS: dict[type[KandevError], int] = {
    BadRequest: 400,
    Unauthenticated: 401,
    OperatorRequired: 403,
    MethodNotAllowed: 405,
    NotFound: 404,
    Conflict: 409,
    RevisionMismatch: 412,
    PayloadTooLarge: 413,
    RequestLineTooLong: 414,
    HeaderFieldsTooLarge: 431,
    RequestTimeout: 408,
    TransferEncodingUnsupported: 501,
    ValidationFailed: 422,
    TooMany: 429,
    EffectFailed: 502,
    Unavailable: 503,
}


# Sent with every HTTP answer of both adapters (api/app.py for REST and the
# auditor's page, mcp/server.py's gate for MCP over HTTP). Every answer is for
# its bearer's eyes and some carry a secret (a created token, a Created's
# creation_handle, an audit link's page): no cache, shared or private, may keep
# one. Set for every route, so a new route that carries a secret is covered too;
# only static assets may be cached.
NO_STORE = ("Cache-Control", "no-store")


def http_status(error: KandevError | type[KandevError]) -> int:
    """The HTTP status of a typed error (or of its class); 500 for one of no
    listed family (InvalidSetting, which only the CLI reports)."""
    for family in (error if isinstance(error, type) else type(error)).__mro__:
        if family in HTTP_STATUS:
            return HTTP_STATUS[family]
    return 500
