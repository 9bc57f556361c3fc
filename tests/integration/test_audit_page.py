"""The auditor's page, both backends: who may see it (admin, operator of the
workspace, or an audit link for exactly that identity until it expires; a member
gets 403 operator_required, anyone else 404 identity not found), typed 400s for
bad query input that change nothing, strict headers, and everything autoescaped;
the proof bundle it offers goes only to whoever reads the full history. The
browser's view is tests/e2e/test_audit_page.py."""

from __future__ import annotations

import html as html_text
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import pytest
from kandev_es_client.ledger import verify_bundle

from kandev_es.api.audit_page import CSP
from kandev_es.domain.identity import Identity
from kandev_es.services import ledger
from kandev_es.services.audit_links import LINK_PARAMETER, AuditLinkService
from tests.conftest import bearer
from tests.integration.helpers import create, start_unsettled_creation

PAGE = "/audit/identities"
PROOF = "/audit/identities/proof"
HOSTILE = "<script>alert(1)</script>&\"'"


@pytest.fixture
def identity(client, services, workspace, admin) -> dict[str, Any]:
    reply = create(
        client,
        admin[1],
        workspace_id=str(workspace.id),
        external_id=HOSTILE,
        title=f"title {HOSTILE}",
    )
    assert reply.status_code == 200, reply.json
    return reply.json


def _query(workspace: Any, external_id: str = HOSTILE, **extra: str) -> dict[str, str]:
    return {"workspace": str(workspace.id), "external_id": external_id, **extra}


def _page(client, query: dict[str, str], secret: str | None = None):
    return client.get(PAGE, query_string=query, headers=bearer(secret) if secret else {})


def test_admin_and_operator_see_the_page_escaped_with_strict_headers(
    client, services, workspace, admin, identity
):
    operator, _ = services.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")
    for secret in (admin[1], operator):
        reply = _page(client, _query(workspace), secret)
        assert reply.status_code == 200
        html = reply.get_data(as_text=True)
        assert "<script" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&#34;&#39;" in html
        assert "title &lt;script&gt;" in html
        assert identity["id"] in html and identity["identifier"] in html
        assert reply.headers["Content-Security-Policy"] == CSP
        assert "script-src" not in CSP and "'unsafe-inline'" not in CSP
        assert "default-src 'none'" in CSP and "style-src 'self'" in CSP
        assert reply.headers["Referrer-Policy"] == "no-referrer"
        assert reply.headers["Cache-Control"] == "no-store"
        assert reply.headers["X-Content-Type-Options"] == "nosniff"
        assert reply.mimetype == "text/html"
    css = client.get("/audit/static/audit.css")
    assert css.status_code == 200 and css.mimetype == "text/css"
    assert css.headers["Content-Security-Policy"] == CSP


def test_member_gets_403_and_strangers_get_404_learning_nothing(
    client, services, workspace, identity
):
    member, _ = services.tokens.issue(workspace_id=workspace.id, admin=False, role="member")
    reply = _page(client, _query(workspace), member)
    assert reply.status_code == 403
    assert "operator_required" in reply.get_data(as_text=True)
    other = services.workspaces.open("elsewhere", "ELS")
    stranger, _ = services.tokens.issue(workspace_id=other.id, admin=False, role="operator")
    bodies = set()
    for secret in (stranger, None, "kes_wrong", "not-a-token"):
        for external_id in (HOSTILE, "NOBODY-HOLDS-THIS"):
            reply = _page(client, _query(workspace, external_id), secret)
            assert reply.status_code == 404
            html = reply.get_data(as_text=True)
            assert "identity not found" in html and identity["id"] not in html
            assert "alert(1)" not in html
            bodies.add(html.split("<footer>")[0])
    assert len(bodies) == 1, "every refusal looks the same, held or not"


def test_the_json_history_route_admits_exactly_whom_the_page_admits(
    client, services, workspace, identity
):
    """One rule (require_auditor) for both ways to read a history: every kind
    of caller gets the same status and error code from each."""
    other = services.workspaces.open("elsewhere", "ELS")
    callers = {
        "admin": services.tokens.issue(workspace_id=None, admin=True)[0],
        "operator": services.tokens.issue(
            workspace_id=workspace.id, admin=False, role="operator"
        )[0],
        "member": services.tokens.issue(
            workspace_id=workspace.id, admin=False, role="member"
        )[0],
        "other operator": services.tokens.issue(
            workspace_id=other.id, admin=False, role="operator"
        )[0],
        "wrong token": "kes_wrong",
        "no token": None,
    }
    history = f"/api/v1/workspaces/{workspace.id}/identities/history"
    answers = {}
    for name, secret in callers.items():
        headers = bearer(secret) if secret else {}
        page = _page(client, _query(workspace), secret)
        json_route = client.get(history, query_string={"external_id": HOSTILE}, headers=headers)
        code = json_route.json.get("error") if json_route.status_code != 200 else None
        assert page.status_code == json_route.status_code, name
        if code is not None:
            assert f'<span class="error-code">{code}</span>' in page.get_data(as_text=True), name
        answers[name] = json_route.status_code
    assert answers == {
        "admin": 200,
        "operator": 200,
        "member": 403,
        "other operator": 404,
        "wrong token": 404,
        "no token": 404,
    }


def test_an_audit_link_opens_only_its_identity_and_only_until_it_expires(
    client, services, workspace, identity
):
    create(
        client,
        services.tokens.issue(workspace_id=None, admin=True)[0],
        workspace_id=str(workspace.id),
        external_id="B-2",
        title="other",
    )
    link = services.audit_links.issue("http://x", workspace.id, HOSTILE, issued_by="test")
    secret = dict(part.split("=", 1) for part in link.url.split("?", 1)[1].split("&"))[
        LINK_PARAMETER
    ]
    assert _page(client, _query(workspace, **{LINK_PARAMETER: secret})).status_code == 200
    refused = [
        _query(workspace, "B-2", **{LINK_PARAMETER: secret}),
        {**_query(workspace, **{LINK_PARAMETER: secret}), "workspace": str(uuid.uuid4())},
        _query(workspace, **{LINK_PARAMETER: secret[:-1]}),
        _query(workspace, **{LINK_PARAMETER: "kal_" + "a" * 300}),
        _query(workspace, **{LINK_PARAMETER: ""}),
    ]
    for query in refused:
        reply = _page(client, query)
        assert reply.status_code == 404, query
        assert "other" not in reply.get_data(as_text=True)
    expired = AuditLinkService(services.app, ttl_seconds=0).issue(
        "http://x", workspace.id, HOSTILE, issued_by="test"
    )
    expired_secret = expired.url.rsplit(f"{LINK_PARAMETER}=", 1)[1]
    assert _page(client, _query(workspace, **{LINK_PARAMETER: expired_secret})).status_code == 404
    # A link is no bearer token, and no stored link holds the secret itself.
    assert services.tokens.authenticate(secret) is None
    assert _page(client, _query(workspace), secret).status_code == 404
    with services.database.transaction() as tx:
        states = [
            bytes(row[0])
            for row in tx.execute(f"SELECT state FROM {services.app.recorder.events_table_name}")
        ]
    assert not [s for s in states if secret.encode() in s]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"external_id": "X"}, "bad_request"),
        ({"workspace": "", "external_id": "X"}, "bad_request"),
        ({"workspace": "acme", "external_id": "X"}, "bad_request"),
        ({"workspace": "WS"}, "invalid_external_id"),
        ({"workspace": "WS", "external_id": "  "}, "invalid_external_id"),
        ({"workspace": "WS", "external_id": "a\nb"}, "invalid_external_id"),
        ({"workspace": "WS", "external_id": "é" * 128}, "invalid_external_id"),
        ({"workspace": "WS", "external_id": "X", "after": "-1"}, "invalid_cursor"),
    ],
)
def test_bad_query_input_is_a_typed_400_and_changes_nothing(
    client, services, workspace, admin, identity, query, code
):
    before = services.app.max_notification_id()
    filled = {k: (str(workspace.id) if v == "WS" else v) for k, v in query.items()}
    reply = _page(client, filled, admin[1])
    assert reply.status_code == 400
    html = reply.get_data(as_text=True)
    assert code in html and reply.headers["Content-Security-Policy"] == CSP
    assert services.app.max_notification_id() == before


def test_query_that_is_not_utf8_is_a_typed_400(client, workspace, admin):
    reply = client.get(f"{PAGE}?workspace={workspace.id}&external_id=%ff", headers=bearer(admin[1]))
    assert reply.status_code == 400 and "malformed_query" in reply.get_data(as_text=True)


def test_a_release_stored_before_actors_existed_shows_unknown(
    client, services, workspace, admin, identity
):
    answer = client.delete(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": HOSTILE},
        headers={**bearer(admin[1]), "Idempotency-Key": "op-old"},
    )
    assert answer.status_code == 200, answer.json
    table = services.app.recorder.events_table_name
    with services.database.transaction() as tx:
        rows = tx.execute(
            f"SELECT originator_id, originator_version, state FROM {table} WHERE topic LIKE ?",
            ("%Identity.Released",),
        )
        assert len(rows) == 1
        originator, version, state = rows[0]
        old = json.loads(bytes(state))
        old.pop("actor")  # as an event written before the actor existed
        tx.execute(
            f"UPDATE {table} SET state = ? WHERE originator_id = ? AND originator_version = ?",
            (json.dumps(old).encode(), originator, version),
        )
    html = _page(client, _query(workspace), admin[1]).get_data(as_text=True)
    release = html[html.index('class="release"') :]
    assert "op-old" in release[:400] and 'by <code class="release-actor">unknown</code>' in release


def test_a_recovered_and_aborted_tenure_shows_its_owner_reason_and_failed_step(
    client, services, workspace, admin
):
    """A creation whose owner died: the Runtime's RecoveryClaimed, a failed step
    with its evidence, Aborting → Aborted; the page shows who aborted and why."""
    task = start_unsettled_creation(services, workspace, "ABORT-1")
    identity = services.app.load(task.identity_id, Identity)
    number = identity.holder.number
    identity.recover(number, "runtime:test-1", datetime.now(UTC) + timedelta(minutes=1))
    identity.record_step(number, "repository:web", "k-1", "failed", {"error": "<b>boom</b>"})
    identity.begin_aborting(number, "repository_effect_failed")
    identity.abort(number)
    services.app.save_atomically(identity)
    reply = _page(client, _query(workspace, "ABORT-1"), admin[1])
    assert reply.status_code == 200
    html = reply.get_data(as_text=True)
    assert 'class="tenure status-aborted"' in html
    abort = html[html.index('class="abort"') :][:300]
    assert "repository_effect_failed" in abort and "runtime:test-1" in abort
    assert "nobody: the identity is free" in html
    assert "&lt;b&gt;boom&lt;/b&gt;" in html and "<b>boom" not in html
    assert "event-RecoveryClaimed" in html and "event-Aborted" in html


def test_each_tenure_links_to_its_task_on_the_page_itself(
    client, services, workspace, admin, identity
):
    """No link leaves the page for the REST API (which wants a bearer header, so
    a browser gets its 404): a tenure's task link is an in-page anchor to a
    section with the task's identifier, title, state, workflow and step."""
    moved = client.patch(
        f"/api/v1/tasks/{identity['id']}",
        json={"workflow_step": "review"},
        headers=bearer(admin[1]),
    )
    assert moved.status_code == 200, moved.json
    html = _page(client, _query(workspace), admin[1]).get_data(as_text=True)
    assert "/api/v1/" not in html, "no link needs a bearer token"
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert hrefs[0] == "/audit/static/audit.css" and hrefs[2:] == [f"#task-{identity['id']}"]
    path, _, query = html_text.unescape(hrefs[1]).partition("?")
    assert path == PROOF and dict(parse_qsl(query)) == _query(workspace), "the bundle's link"
    section = html[html.index(f'id="task-{identity["id"]}"') :]
    section = section[: section.index("</section>")]
    for fact in (identity["identifier"], identity["id"], "active", "default", "review"):
        assert fact in section, fact
    assert "title &lt;script&gt;alert(1)&lt;/script&gt;" in section and "<script" not in section


def test_the_proof_bundle_goes_to_whoever_reads_the_full_history_and_verifies_offline(
    client, services, workspace, identity
):
    """The bundle holds the events unredacted: an admin or an operator of the
    workspace (who read the full history as JSON too) download it, the very
    bundle the JSON route serves, and the verifier checks it with only the
    public key; an audit link (a redacted reader) and a member get 403
    operator_required, anyone else 404; bad input is a typed 400."""
    operator, _ = services.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")
    assert client.get(PROOF, query_string=_query(workspace),
                      headers=bearer(operator)).status_code == 404  # no checkpoint signed yet
    _checkpoint_covering(services, workspace)
    link = services.audit_links.issue("http://x", workspace.id, HOSTILE, issued_by="test")
    secret = link.url.rsplit(f"{LINK_PARAMETER}=", 1)[1]
    other = services.workspaces.open("elsewhere", "ELS")
    callers = {
        "admin": (services.tokens.issue(workspace_id=None, admin=True)[0], {}),
        "operator": (operator, {}),
        "member": (services.tokens.issue(workspace_id=workspace.id, admin=False)[0], {}),
        "audit link": (None, {LINK_PARAMETER: secret}),
        "other operator": (services.tokens.issue(
            workspace_id=other.id, admin=False, role="operator")[0], {}),
        "no token": (None, {}),
    }
    answers, codes, bodies = {}, {}, {}
    for name, (token, extra) in callers.items():
        reply = client.get(PROOF, query_string=_query(workspace, **extra),
                           headers=bearer(token) if token else {})
        answers[name] = reply.status_code
        text = reply.get_data(as_text=True)
        codes[name] = re.findall(r'class="error-code">([^<]*)<', text)
        bodies[name] = reply
        assert reply.headers["Content-Security-Policy"] == CSP
    assert answers == {"admin": 200, "operator": 200, "member": 403, "audit link": 403,
                       "other operator": 404, "no token": 404}
    assert codes["member"] == codes["audit link"] == ["operator_required"]
    assert codes["no token"] == codes["other operator"] == ["identity not found"]
    assert HOSTILE not in bodies["audit link"].get_data(as_text=True)

    downloaded = bodies["operator"]
    assert downloaded.mimetype == "application/json"
    disposition = downloaded.headers["Content-Disposition"]
    assert disposition == f'attachment; filename="proof-{identity_stream(workspace)}.json"'
    bundle = downloaded.json
    keyring = ledger.keyring_of(ledger.load_signer(services.settings))
    report = verify_bundle(bundle, keyring)
    assert report.ok and {f.status for f in report.findings} == {"verified"}, report.lines()
    history = client.get(f"/api/v1/workspaces/{workspace.id}/identities/history",
                         query_string={"external_id": HOSTILE, "proof": "1"},
                         headers=bearer(operator))
    assert history.json["proof"] == bundle, "one bundle, whichever way it is fetched"

    offered = _page(client, _query(workspace), operator).get_data(as_text=True)
    assert 'class="proof-download"' in offered
    withheld = _page(client, _query(workspace, **{LINK_PARAMETER: secret})).get_data(as_text=True)
    assert "proof-download" not in withheld and 'class="proof proof-withheld"' in withheld
    for query, code in (({"external_id": "X"}, "bad_request"),
                        ({"workspace": str(workspace.id), "external_id": " "},
                         "invalid_external_id")):
        refused = client.get(PROOF, query_string=query, headers=bearer(operator))
        assert refused.status_code == 400 and code in refused.get_data(as_text=True)


def _checkpoint_covering(services: Any, workspace: Any, seconds: float = 20.0) -> None:
    """Sequence and sign until a checkpoint covers every event of the identity:
    on a busy shared PostgreSQL the settled prefix may trail a commit a moment."""
    keyring = ledger.keyring_of(ledger.load_signer(services.settings))
    deadline = time.monotonic() + seconds
    while True:
        services.ledger.catch_up()
        bundle = ledger.proof_bundle(services.app, services.database, workspace.id, HOSTILE)
        size = keyring.open_checkpoint(bundle["checkpoint"]).size
        if all(e["leaf_index"] is not None and e["leaf_index"] < size for e in bundle["events"]):
            return
        assert time.monotonic() < deadline, "no checkpoint covers the identity's events"
        time.sleep(0.05)


def identity_stream(workspace: Any) -> uuid.UUID:
    from kandev_es.domain.external_id import identity_id

    return identity_id(workspace.id, HOSTILE)
