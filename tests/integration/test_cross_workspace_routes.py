"""Security: every route of the app, found by walking Flask's url_map, denies a
token of another workspace with 404 and leaks nothing about the victim's task;
the victim's task is unchanged afterwards. Bodies over KANDEV_MAX_BODY_BYTES get
a typed 413; tokens are stored hashed."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from kandev_es.domain.external_id import identity_id
from kandev_es.webhooks.addresses import NetworkPolicy
from kandev_es.webhooks.subscriptions import WebhookService
from tests.conftest import bearer
from tests.integration.helpers import create

# Routes that act on no workspace's data: public probes and the admin-only
# workspace/token creation (checked separately below).
UNSCOPED = {
    "/static/<path:filename>",
    "/audit/static/<path:filename>",  # the auditor's page's stylesheet
    "/api/openapi.json",
    "/api/docs",  # the interactive API reference and its local assets
    "/api/docs/assets/<name>",
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/webhooks/public-key",  # the v1a verifying key, the same for every receiver
}
ADMIN_ONLY = {"/api/v1/workspaces", "/api/v1/tokens"}
# The Merkle log's checkpoints and consistency proofs are about the whole log (a
# tree size and hashes, meant to be shipped outside): any valid token reads them,
# and they name no workspace's data (checked below).
WHOLE_LOG = {"/api/v1/ledger/checkpoint", "/api/v1/ledger/consistency"}
# Admin-only routes on one token (revoking it), checked below with the victim's token.
ADMIN_ONLY_TOKEN = "/api/v1/tokens/<token_id>"
PARAM = re.compile(r"<(?:[a-z]+:)?([a-z_]+)>")


@pytest.fixture
def victim(client, services, workspace, member) -> dict[str, Any]:
    _, secret = member
    reply = create(client, secret, external_id="VICTIM-1", title="secret plans")
    assert reply.status_code == 200, reply.json
    # the webhook routes name one of the victim's subscriptions: to a
    # documentation address (allowed for this one create; nothing delivers here)
    webhooks = services.webhooks.service
    allowing = WebhookService(
        webhooks.store, NetworkPolicy.from_settings(["192.0.2.0/24"], False), webhooks.overlap
    )
    subscription, _ = allowing.create(
        workspace.id, "https://192.0.2.10/hook", ["task.created"], "victim's"
    )
    return {**reply.json, "webhook_id": subscription["id"]}


@pytest.fixture
def intruder(services) -> dict[str, str]:
    other = services.workspaces.open("intruder", "INT")
    secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    return bearer(secret)


def scoped_routes(app: Any) -> list[tuple[str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.rule in UNSCOPED | ADMIN_ONLY | WHOLE_LOG or rule.rule == ADMIN_ONLY_TOKEN:
            continue
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            routes.append((method, rule.rule))
    return routes


def fill(rule: str, victim: dict[str, Any]) -> str:
    values = {
        "workspace_id": victim["workspace_id"],
        "task_id": victim["id"],
        "handle": victim["creation_handle"],
        # a parked creation's settling routes name the victim's identity
        "identity_id": identity_id(uuid.UUID(victim["workspace_id"]), "VICTIM-1"),
        "webhook_id": victim["webhook_id"],
    }

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"new path parameter {name!r} in {rule}: teach this test"
        return str(values[name])

    return PARAM.sub(value, rule)


def leaks(text: str, victim: dict[str, Any]) -> list[str]:
    return [
        s
        for s in (victim["id"], victim["title"], "VICTIM-1", victim["identifier"],
                  victim["webhook_id"], "192.0.2.10")
        if s in text
    ]


def test_every_scoped_route_denies_another_workspace_with_404_and_leaks_nothing(
    client, services, victim, intruder
):
    app = client.application
    routes = scoped_routes(app)
    assert len(routes) >= 20, routes
    body = {
        "workspace_id": victim["workspace_id"],
        "external_id": "VICTIM-1",
        "title": "hijack",
        "name": "repo",
        "path": "/tmp",
        "wip_limit": 1,
    }
    query = {
        "external_id": "VICTIM-1",
        "max_seconds": "0",
        "filename": "x.txt",
        "workspace": victim["workspace_id"],  # the auditor's page
    }
    headers = {**intruder, "Idempotency-Key": "op-intruder"}
    failures = []
    for method, rule in routes:
        path = fill(rule, victim)
        reply = client.open(path, method=method, json=body, query_string=query, headers=headers)
        text = reply.get_data(as_text=True)
        if reply.status_code != 404 or leaks(text, victim):
            failures.append(f"{method} {rule} -> {reply.status_code} {text[:200]}")
    assert failures == []
    after = client.get(f"/api/v1/tasks/{victim['id']}", headers=bearer(_admin_secret(services)))
    assert after.status_code == 200
    assert after.json["title"] == "secret plans"
    assert after.json["revision"] == victim["revision"]
    assert after.json["external_id"] == "VICTIM-1"


def test_the_whole_logs_routes_name_nothing_of_another_workspace(client, victim, intruder):
    for rule in sorted(WHOLE_LOG):
        reply = client.get(rule, query_string={"from": "1"}, headers=intruder)
        assert reply.status_code in (200, 400, 404), (rule, reply.status_code, reply.json)
        assert not leaks(reply.get_data(as_text=True), victim)


def _admin_secret(services: Any) -> str:
    secret, _ = services.tokens.issue(workspace_id=None, admin=True)
    return secret


def test_admin_only_routes_refuse_a_workspace_token(client, victim, intruder, member):
    for rule in sorted(ADMIN_ONLY):
        reply = client.post(rule, json={"name": "evil", "admin": True}, headers=intruder)
        assert reply.status_code in (403, 404), (rule, reply.status_code, reply.json)
        assert not leaks(reply.get_data(as_text=True), victim)
    principal, secret = member
    revoke = ADMIN_ONLY_TOKEN.replace("<token_id>", str(principal.token_id))
    reply = client.delete(revoke, headers=intruder)
    assert reply.status_code == 404, reply.json
    assert not leaks(reply.get_data(as_text=True), victim)
    still = client.get(f"/api/v1/tasks/{victim['id']}", headers=bearer(secret))
    assert still.status_code == 200, "the victim's token still works"


def test_body_over_the_size_limit_gets_a_typed_413(settings, member, workspace):
    small = bootstrap(settings.with_overrides(max_body_bytes=2048, create_tables=False))
    try:
        client = create_app(services=small, run_projections=False).test_client()
        _, secret = member
        body = {"workspace_id": str(workspace.id), "title": "x" * 4096}
        reply = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
        assert reply.status_code == 413
        assert reply.json["error"] == "payload_too_large"
        fits = client.post(
            "/api/v1/tasks", json={**body, "title": "fits"}, headers=bearer(secret)
        )
        assert fits.status_code == 200, fits.json
    finally:
        small.close()


def test_token_secret_never_reaches_the_store_and_a_near_miss_is_refused(services, workspace):
    secret, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    blobs = [n.state for n in services.app.recorder.select_notifications(start=1, limit=10_000)]
    assert not any(secret.encode() in blob or secret[4:].encode() in blob for blob in blobs)
    assert services.tokens.authenticate(secret) == principal
    assert services.tokens.authenticate(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    assert services.tokens.authenticate(secret + "x") is None
