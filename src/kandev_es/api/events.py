"""The task.created / task.updated feeds: a paged read and an SSE stream.

Feeds come from a read model and may lag the event store by the projection
delay. A workspace token reads its own workspace, an admin token any; anything
else is 404 (never revealing whether the workspace exists)."""

from __future__ import annotations

import uuid
from typing import Any, cast

from flask import Response, current_app, request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields

from kandev_es.api.context import bearer_secret, path_uuid, principal, services
from kandev_es.api.errors import document_errors
from kandev_es.domain.principal import Principal
from kandev_es.errors import WorkspaceNotFound
from kandev_es.limits import MAX_CURSOR, parse_bounded, parse_cursor
from kandev_es.services.fanout import StreamAccess, Subscription
from kandev_es.services.feeds import (
    MAX_PAGE,
    MAX_STREAM_SECONDS,
    feed_page,
    never_gone,
    sse_stream,
)
from kandev_es.services.stream_slots import HeldStream, StreamSlots
from kandev_es.views import TaskSchema

blp = Blueprint("events", __name__, url_prefix="/api/v1", description="Event feeds")

_AFTER = {
    "name": "after",
    "in": "query",
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR},
    "description": "feed cursor: return events after this position (400 invalid_cursor outside)",
}


def _authorized(workspace_id: str) -> tuple[uuid.UUID, Principal]:
    target = path_uuid(workspace_id, "workspace id")
    who = principal()
    if who is None or not who.may_act_on(target) or services().workspaces.get(target) is None:
        raise WorkspaceNotFound("workspace not found")
    return target, who


def _authorized_workspace(workspace_id: str) -> uuid.UUID:
    return _authorized(workspace_id)[0]


STREAM_SLOTS_KEY = "kandev_es.streams"


def _slots() -> StreamSlots:
    # Built once by create_app: a pool made lazily here could be made twice by
    # two first streams at once, and a slot taken in the lost one would escape
    # the caps.
    return cast(StreamSlots, current_app.extensions[STREAM_SLOTS_KEY])


class EventEnvelopeSchema(Schema):
    """One feed entry (services/feeds.py), the same in the page and the stream."""

    id = fields.UUID(required=True, metadata={"description": "the event's own id, stable"})
    type = fields.String(required=True, metadata={"description": "task.created or task.updated"})
    subject = fields.UUID(required=True, metadata={"description": "the task id"})
    source = fields.String(required=True, metadata={"description": "kandev-es/workspaces/<id>"})
    timestamp = fields.DateTime(required=True)
    data = fields.Nested(TaskSchema, required=True, metadata={"description": "the task"})


class EventPageSchema(Schema):
    items = fields.List(fields.Nested(EventEnvelopeSchema), required=True)
    next_cursor = fields.Integer(
        required=True, metadata={"description": "pass back as after for the next page"}
    )
    has_more = fields.Boolean(required=True)


@blp.route("/workspaces/<workspace_id>/events")
class EventFeed(MethodView):
    @blp.doc(
        parameters=[
            _AFTER,
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                "description": f"most events on the page (default 100, at most {MAX_PAGE})",
            },
        ],
        responses={
            200: {
                "description": "a page: items, next_cursor, has_more",
                "content": {"application/json": {"schema": EventPageSchema}},
            }
        },
    )
    @document_errors(blp, 400, 404)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """task.created / task.updated events after a cursor

        The workspace's feed in commit order, `limit` at a time (default 100). Start
        at `after=0`; pass `next_cursor` back as `after` while `has_more`. Each item
        carries the task as this API shows it.
        """
        target = _authorized_workspace(workspace_id)
        after = parse_cursor(request.args.get("after"))
        limit = int(parse_bounded(request.args.get("limit"), "limit", 100, 1, MAX_PAGE))
        svc = services()
        return feed_page(svc.database, target, after, limit, svc.app.settled_rows)


@blp.route("/workspaces/<workspace_id>/events/stream")
class EventStream(MethodView):
    @blp.doc(
        parameters=[
            _AFTER,
            {
                "name": "max_seconds",
                "in": "query",
                "schema": {"type": "number", "minimum": 0, "maximum": MAX_STREAM_SECONDS},
                "description": "end the stream after this many seconds (default 300); "
                "reconnect with Last-Event-ID to go on",
            },
            {
                "name": "Last-Event-ID",
                "in": "header",
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CURSOR},
                "description": "the last event id seen: resume after it (wins over `after`)",
            },
        ],
        responses={
            200: {
                "description": "text/event-stream; each id is a feed cursor",
                "content": {
                    "text/event-stream": {
                        "schema": {"type": "string"},
                        "example": "id: 6\nevent: task.created\ndata: {\"id\": …}\n\n",
                    }
                },
            }
        },
    )
    @document_errors(blp, 400, 404, 503)
    def get(self, workspace_id: str) -> Response:
        """The feed as Server-Sent Events; resume with Last-Event-ID

        The same entries as the paged feed, as they are committed: `event:` is the
        type, `data:` the entry, `id:` its cursor. Reconnect with `Last-Event-ID`
        (or `?after=`) to resume after the last one seen. Ends after `max_seconds`,
        or when the token is revoked or the workspace deleted; 503
        `stream_limit_reached` when the token or the server has too many open.
        """
        target, who = _authorized(workspace_id)
        resume = request.headers.get("Last-Event-ID")
        if resume is not None and resume.strip():
            after = parse_cursor(resume, "Last-Event-ID")
        else:
            after = parse_cursor(request.args.get("after"))
        max_seconds = parse_bounded(
            request.args.get("max_seconds"), "max_seconds", 300, 0, MAX_STREAM_SECONDS
        )
        svc = services()
        grant = StreamAccess.grant(bearer_secret(), target)
        slots = _slots()
        slots.take(who.token_id)  # 503 stream_limit_reached before the stream starts

        def follow() -> Subscription:  # when the stream starts
            return svc.feeds.subscribe(target, after, grant)

        return Response(
            HeldStream(
                slots,
                who.token_id,
                sse_stream(
                    follow,
                    max_seconds,
                    gone=request.environ.get("waitress.client_disconnected", never_gone),
                ),
            ),
            mimetype="text/event-stream",
            headers={"X-Accel-Buffering": "no"},  # Cache-Control: api/app.py
        )
