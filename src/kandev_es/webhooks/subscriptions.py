"""Webhook subscriptions of a workspace: create (the secret shown once),
list, get, pause, resume (also re-enables a disabled one), delete, rotate
the secret, replay from a feed position, and the delivery log. Who may is
the adapters' check (an operator of the workspace or an admin)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kandev_es.errors import (
    InvalidCursor,
    UnknownEventType,
    ValidationFailed,
    WebhookLimitReached,
    WebhookNotFound,
    WebhookPaused,
)
from kandev_es.limits import MAX_CURSOR
from kandev_es.projections.feeds import TASK_CREATED, TASK_UPDATED
from kandev_es.webhooks.addresses import NetworkPolicy, check_url
from kandev_es.webhooks.signing import new_secret
from kandev_es.webhooks.store import (
    ACTIVE,
    DISABLED,
    PAUSED,
    Attempt,
    Subscription,
    SubscriptionStore,
)

EVENT_TYPES = (TASK_CREATED, TASK_UPDATED)
MAX_SUBSCRIPTIONS = 20  # per workspace: each one is a thread of the deliverer
MAX_DESCRIPTION = 500
MAX_LOG = 100


def _iso(seconds: float | None) -> str | None:
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def subscription_dto(s: Subscription, now: float | None = None) -> dict[str, Any]:
    """What a listing shows: never a secret."""
    now = time.time() if now is None else now
    overlap = s.old_secret_until if len(s.secrets_in_use(now)) > 1 else None
    return {
        "id": str(s.id),
        "workspace_id": str(s.workspace_id),
        "url": s.url,
        "event_types": list(s.event_types),
        "description": s.description,
        "state": s.state,
        "disabled_reason": s.reason if s.state == DISABLED else None,
        "cursor": s.cursor,
        "attempts": s.attempts,
        "next_attempt_at": _iso(s.next_attempt_at) if s.attempts else None,
        "previous_secret_expires_at": _iso(overlap),
        "created_at": _iso(s.created_at),
        "updated_at": _iso(s.updated_at),
    }


def attempt_dto(a: Attempt) -> dict[str, Any]:
    return {
        "position": a.position,
        "webhook_id": a.event_id,
        "attempt": a.attempt,
        "at": _iso(a.at),
        "result": a.result,
        "status": a.status,
        "latency_ms": round(a.latency_ms, 1),
        "response": a.snippet,
        "next_attempt_at": _iso(a.next_attempt_at),
        "request_id": a.request_id,
    }


def check_event_types(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise UnknownEventType("event_types must be a non-empty list of: " + ", ".join(EVENT_TYPES))
    unknown = [str(v)[:60] for v in value if v not in EVENT_TYPES]
    if unknown:
        raise UnknownEventType(
            f"unknown event type {unknown[0]!r}: one of {', '.join(EVENT_TYPES)}",
            known=list(EVENT_TYPES),
        )
    return tuple(t for t in EVENT_TYPES if t in value)


def check_cursor(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CURSOR:
        raise InvalidCursor(f"after must be a feed cursor: an integer in [0, {MAX_CURSOR}]")
    return value


class WebhookService:
    def __init__(self, store: SubscriptionStore, policy: NetworkPolicy, overlap: float):
        self.store = store
        self.policy = policy
        self.overlap = overlap

    def create(
        self,
        workspace_id: uuid.UUID,
        url: object,
        event_types: object,
        description: object = "",
        after: object = None,
    ) -> tuple[dict[str, Any], str]:
        """A new active subscription and its secret (shown this once). It
        starts at the feed's head (``after``: at that feed position)."""
        types = check_event_types(event_types)
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise ValidationFailed(f"description must be text of at most {MAX_DESCRIPTION}")
        target = check_url(url, self.policy)
        cursor = self.store.feed_head(workspace_id) if after is None else check_cursor(after)
        if self.store.count(workspace_id) >= MAX_SUBSCRIPTIONS:
            raise WebhookLimitReached(
                f"a workspace has at most {MAX_SUBSCRIPTIONS} webhook subscriptions"
            )
        now = time.time()
        secret = new_secret()
        subscription = Subscription(
            uuid.uuid4(),
            workspace_id,
            target.url,
            types,
            description,
            secret,
            None,
            None,
            ACTIVE,
            None,
            cursor,
            0,
            0.0,
            0,
            now,
            now,
        )
        self.store.insert(subscription)
        return subscription_dto(subscription, now), secret

    def _find(self, workspace_id: uuid.UUID, subscription_id: uuid.UUID) -> Subscription:
        found = self.store.get(subscription_id)
        if found is None or found.workspace_id != workspace_id:
            raise WebhookNotFound("webhook subscription not found")
        return found

    def get(self, workspace_id: uuid.UUID, subscription_id: uuid.UUID) -> dict[str, Any]:
        return subscription_dto(self._find(workspace_id, subscription_id))

    def list(self, workspace_id: uuid.UUID) -> list[dict[str, Any]]:
        now = time.time()
        return [subscription_dto(s, now) for s in self.store.of_workspace(workspace_id)]

    def _change(
        self, workspace_id: uuid.UUID, subscription_id: uuid.UUID, **changes: Any
    ) -> dict[str, Any]:
        self._find(workspace_id, subscription_id)
        changed = self.store.update(subscription_id, **changes)
        if changed is None:
            raise WebhookNotFound("webhook subscription not found")
        return subscription_dto(changed)

    def pause(self, workspace_id: uuid.UUID, subscription_id: uuid.UUID) -> dict[str, Any]:
        """No delivery until resumed; the cursor stays where it is."""
        return self._change(workspace_id, subscription_id, state=PAUSED)

    def resume(self, workspace_id: uuid.UUID, subscription_id: uuid.UUID) -> dict[str, Any]:
        """Deliver again from the cursor, at once: a paused subscription, or a
        disabled one (re-enabled: its reason cleared, its attempts at 0)."""
        return self._change(
            workspace_id,
            subscription_id,
            state=ACTIVE,
            reason=None,
            attempts=0,
            next_attempt_at=0.0,
        )

    def replay(
        self, workspace_id: uuid.UUID, subscription_id: uuid.UUID, after: object
    ) -> dict[str, Any]:
        """Deliver again from feed position ``after`` (the cursor of the JSON
        feed and of SSE): every event after it, in order. A disabled
        subscription keeps its state (resume it); a paused one is refused."""
        cursor = check_cursor(after)
        if self._find(workspace_id, subscription_id).state == PAUSED:
            raise WebhookPaused("the subscription is paused: resume it, then replay")
        return self._change(
            workspace_id, subscription_id, cursor=cursor, attempts=0, next_attempt_at=0.0
        )

    def rotate_secret(
        self, workspace_id: uuid.UUID, subscription_id: uuid.UUID, overlap: float | None = None
    ) -> tuple[dict[str, Any], str]:
        """A new secret (shown this once); the old one keeps signing beside it
        for ``overlap`` seconds (default KANDEV_WEBHOOK_SECRET_OVERLAP, 24 h)."""
        window = self.overlap if overlap is None else overlap
        if isinstance(window, bool) or not 0 <= window <= 30 * 86400:
            raise ValidationFailed("overlap_seconds must be in [0, 2592000]")
        current = self._find(workspace_id, subscription_id)
        secret = new_secret()
        dto = self._change(
            workspace_id,
            subscription_id,
            secret=secret,
            old_secret=current.secret,
            old_secret_until=time.time() + window,
        )
        return dto, secret

    def delete(self, workspace_id: uuid.UUID, subscription_id: uuid.UUID) -> dict[str, Any]:
        found = self._find(workspace_id, subscription_id)
        if not self.store.delete(subscription_id):
            raise WebhookNotFound("webhook subscription not found")
        return subscription_dto(replace(found, state="deleted"))

    def forget_workspace(self, workspace_id: uuid.UUID) -> int:
        """After a workspace's deletion: its subscriptions, secrets and logs go
        (a later workspace of the same name is another workspace)."""
        return self.store.delete_workspace(workspace_id)

    def deliveries(
        self, workspace_id: uuid.UUID, subscription_id: uuid.UUID, limit: int = 20
    ) -> dict[str, Any]:
        """The latest attempts, newest first, and where the subscription stands."""
        found = self._find(workspace_id, subscription_id)
        attempts = self.store.deliveries(subscription_id, max(1, min(limit, MAX_LOG)))
        items = [attempt_dto(a) for a in attempts]
        return {"subscription": subscription_dto(found), "items": items}
