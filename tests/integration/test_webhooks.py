"""Webhooks over real HTTP receivers on 127.0.0.1, on both backends: the
subscriptions' routes and refusals, delivery in feed order with retries,
signatures checked by the reference library (standardwebhooks) and by
Ed25519 with the public key alone, 410 and a spent schedule disabling,
resume and replay, 3xx not followed, bounded answers and timeouts, the
connect-time address check."""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from tests.conftest import bearer
from tests.integration.helpers import create
from tests.support.receiver import Receiver

SHORT = (0.2, 0.2, 0.2, 0.2, 0.2, 0.2)


@pytest.fixture
def settings(settings):
    return settings.with_overrides(
        webhook_allow_http=True,
        webhook_allow_networks=("127.0.0.0/8",),
        webhook_retry_schedule=SHORT,
        webhook_timeout=2.0,
    )


@pytest.fixture
def deliverer(services):
    found = services.webhooks.deliverer()
    thread = found.start_thread()
    yield found
    found.stop()
    thread.join(10)


def subscribe(client, workspace, secret, url, types=("task.created", "task.updated"), **more):
    answer = client.post(
        f"/api/v1/workspaces/{workspace.id}/webhooks",
        json={"url": url, "event_types": list(types), **more},
        headers=bearer(secret),
    )
    assert answer.status_code == 201, answer.json
    return answer.json


def make_tasks(client, workspace, secret, count, prefix="T"):
    for n in range(count):
        answer = create(client, secret, workspace_id=str(workspace.id), title=f"{prefix}{n}")
        assert answer.status_code in (200, 201), answer.json


def feed_ids(client, workspace, secret, after=0):
    answer = client.get(
        f"/api/v1/workspaces/{workspace.id}/events",
        query_string={"after": after, "limit": 1000},
        headers=bearer(secret),
    )
    return [item["id"] for item in answer.json["items"]]


def v1a_verifies(public_key, received):
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    content = (
        f"{received.headers['webhook-id']}.{received.headers['webhook-timestamp']}.".encode()
        + received.body
    )
    signatures = [
        s.split(",", 1)[1]
        for s in received.headers["webhook-signature"].split()
        if s.startswith("v1a,")
    ]
    assert len(signatures) == 1
    key.verify(base64.b64decode(signatures[0]), content)  # raises if it does not verify
    return True


def test_subscription_routes_and_the_secret_shown_once(
    client, services, workspace, operator, member
):
    _, secret = operator
    made = subscribe(
        client,
        workspace,
        secret,
        "http://127.0.0.1:9/hook",
        ("task.created",),
        description="slack relay",
    )
    assert made["secret"].startswith("whsec_")
    assert len(base64.b64decode(made["secret"].removeprefix("whsec_"))) >= 24
    assert made["state"] == "active" and made["event_types"] == ["task.created"]
    base = f"/api/v1/workspaces/{workspace.id}/webhooks"
    listed = client.get(base, headers=bearer(secret)).json["items"]
    assert [s["id"] for s in listed] == [made["id"]]
    got = client.get(f"{base}/{made['id']}", headers=bearer(secret)).json
    assert "secret" not in got and "secret" not in listed[0]
    assert client.post(f"{base}/{made['id']}/pause", headers=bearer(secret)).json["state"] == (
        "paused"
    )
    refused = client.post(f"{base}/{made['id']}/replay", json={"after": 0}, headers=bearer(secret))
    assert refused.status_code == 409 and refused.json["error"] == "webhook_paused"
    assert client.post(f"{base}/{made['id']}/resume", headers=bearer(secret)).json["state"] == (
        "active"
    )
    rotated = client.post(f"{base}/{made['id']}/rotate-secret", headers=bearer(secret)).json
    assert rotated["secret"] != made["secret"] and rotated["previous_secret_expires_at"]
    # a member sees nothing of it; another workspace's operator not even the workspace
    assert client.get(base, headers=bearer(member[1])).status_code == 403
    assert client.delete(f"{base}/{made['id']}", headers=bearer(secret)).status_code == 200
    gone = client.get(f"{base}/{made['id']}", headers=bearer(secret))
    assert gone.status_code == 404 and gone.json["error"] == "webhook_not_found"
    # a deleted workspace's subscriptions go with it, secrets and all
    subscribe(client, workspace, secret, "http://127.0.0.1:9/hook")
    assert client.delete(
        f"/api/v1/workspaces/{workspace.id}", headers=bearer(secret)
    ).status_code == (200)
    assert services.webhooks.store.all() == []


BAD = [
    ({"url": "not a url", "event_types": ["task.created"]}, "invalid_webhook_url"),
    ({"url": "ftp://example.com/x", "event_types": ["task.created"]}, "invalid_webhook_url"),
    (
        {"url": "https://user:pw@example.com/", "event_types": ["task.created"]},
        "invalid_webhook_url",
    ),
    ({"url": 7, "event_types": ["task.created"]}, "invalid_webhook_url"),
    ({"url": "https://10.1.2.3/x", "event_types": ["task.created"]}, "webhook_address_refused"),
    (
        {"url": "https://169.254.169.254/latest", "event_types": ["task.created"]},
        "webhook_address_refused",
    ),
    (
        {"url": "https://100.100.100.200/", "event_types": ["task.created"]},
        "webhook_address_refused",
    ),
    (
        {"url": "https://[::ffff:10.0.0.1]/", "event_types": ["task.created"]},
        "webhook_address_refused",
    ),
    (
        {"url": "https://[fd00:ec2::254]/", "event_types": ["task.created"]},
        "webhook_address_refused",
    ),
    ({"url": "https://224.0.0.1/", "event_types": ["task.created"]}, "webhook_address_refused"),
    ({"url": "https://127.0.0.1/", "event_types": ["task.deleted"]}, "unknown_event_type"),
    ({"url": "https://127.0.0.1/", "event_types": []}, "unknown_event_type"),
    ({"url": "https://127.0.0.1/", "event_types": "task.created"}, "unknown_event_type"),
]


def test_bad_subscriptions_are_typed_refusals_that_change_nothing(client, workspace, operator):
    _, secret = operator
    base = f"/api/v1/workspaces/{workspace.id}/webhooks"
    for body, code in BAD:
        answer = client.post(base, json=body, headers=bearer(secret))
        assert answer.status_code == 422, (body, answer.json)
        assert answer.json["error"] == code, body
    assert client.get(base, headers=bearer(secret)).json["items"] == []
    not_json = client.post(base, data=b"{", headers=bearer(secret))
    assert not_json.status_code == 400


def test_http_and_loopback_are_refused_without_the_settings(services, workspace):
    from kandev_es.errors import InvalidWebhookUrl, WebhookAddressRefused
    from kandev_es.webhooks import Webhooks

    strict = Webhooks.build(
        services.settings.with_overrides(webhook_allow_http=False, webhook_allow_networks=()),
        services.app,
        services.database,
    ).service
    with pytest.raises(InvalidWebhookUrl):
        strict.create(workspace.id, "http://example.com/hook", ["task.created"])
    with pytest.raises(WebhookAddressRefused):
        strict.create(workspace.id, "https://127.0.0.1/hook", ["task.created"])
    with pytest.raises(WebhookAddressRefused):
        strict.create(workspace.id, "https://localhost/hook", ["task.created"])


def test_in_feed_order_the_third_event_failing_five_times_holds_the_rest_back(
    client, services, workspace, operator, member, deliverer
):
    def behaviour(received, nth):
        third = received.event["data"]["title"] == "T2"
        return (500, {}, b"not yet") if third and nth <= 5 else (200, {}, b"ok")

    with Receiver(behaviour) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 6)
        expected = feed_ids(client, workspace, member[1])
        assert len(expected) == 6
        got = receiver.wait_for(lambda r: sum(1 for x in r if x.webhook_id == expected[-1]))
    ids = [r.webhook_id for r in got]
    assert ids == expected[:2] + [expected[2]] * 6 + expected[3:]
    webhook = Webhook(made["secret"])
    public_key = client.get("/api/v1/webhooks/public-key", headers=bearer(member[1])).json[
        "public_key"
    ]
    for received in got:
        assert webhook.verify(received.body, received.headers)["id"] == received.webhook_id
        assert v1a_verifies(public_key, received)
    # a 2xx is logged by the deliverer's next progress write, after the receiver has it
    log = logged(services, workspace, made["id"], len(got))
    attempts_of_third = sorted(a["attempt"] for a in log if a["webhook_id"] == expected[2])
    assert attempts_of_third == [1, 2, 3, 4, 5, 6]
    # each attempt carries its own request id, as the log keeps it (a request's, traced alike)
    request_ids = {a["request_id"] for a in log}
    assert {r.headers["x-request-id"] for r in got} == request_ids and len(log) == len(got)
    state = services.webhooks.service.get(workspace.id, uuid.UUID(made["id"]))
    assert state["attempts"] == 0 and state["state"] == "active"


def test_gone_disables_at_once_and_resume_and_replay_deliver_again(
    client, services, workspace, operator, member, deliverer
):
    answers = {"status": 410}

    def behaviour(received, nth):
        return answers["status"], {}, b""

    with Receiver(behaviour) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url, ("task.created",))
        make_tasks(client, workspace, member[1], 3)
        expected = feed_ids(client, workspace, member[1])
        receiver.wait_for(lambda r: len(r) >= 1)
        sid = uuid.UUID(made["id"])
        _wait(lambda: services.webhooks.service.get(workspace.id, sid)["state"] == "disabled")
        state = services.webhooks.service.get(workspace.id, sid)
        assert "410" in state["disabled_reason"]
        time.sleep(1.5)
        assert len(receiver.received) == 1  # a disabled subscription is a cursor that stopped
        answers["status"] = 204
        services.webhooks.service.resume(workspace.id, sid)
        receiver.wait_for(lambda r: [x.webhook_id for x in r][1:] == expected)
        services.webhooks.service.replay(workspace.id, sid, 0)
        got = receiver.wait_for(lambda r: len(r) == 1 + 2 * len(expected))
    assert [x.webhook_id for x in got][1 + len(expected) :] == expected


def test_a_spent_schedule_disables_with_its_reason_and_3xx_is_not_followed(
    client, services, workspace, operator, member, deliverer
):
    def behaviour(received, nth):
        return 302, {"location": "/elsewhere"}, b""

    with Receiver(behaviour) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 2)
        sid = uuid.UUID(made["id"])
        _wait(lambda: services.webhooks.service.get(workspace.id, sid)["state"] == "disabled")
    state = services.webhooks.service.get(workspace.id, sid)
    assert "gave up" in state["disabled_reason"] and "HTTP 302" in state["disabled_reason"]
    assert {r.path for r in receiver.received} == {"/hook"}
    assert len(receiver.received) == len(SHORT) + 1
    assert len({r.webhook_id for r in receiver.received}) == 1  # the first event only


def test_big_and_silent_receivers_are_bounded(
    client, services, workspace, operator, member, deliverer
):
    def behaviour(received, nth):
        if received.event["data"]["title"] == "T0":
            return 200, {}, b"x" * (10 * 1024 * 1024)
        if nth == 1:
            time.sleep(4)  # past the 2 s timeout: no answer in time
            return None
        return 200, {}, b"ok"

    with Receiver(behaviour) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 2)
        expected = feed_ids(client, workspace, member[1])
        got = receiver.wait_for(
            lambda r: [x.webhook_id for x in r] == [expected[0]] + [expected[1]] * 2, timeout=30
        )
    assert len(got) == 3
    log = logged(services, workspace, made["id"], 3)
    results = [(a["webhook_id"], a["result"]) for a in reversed(log)]
    assert results == [
        (expected[0], "delivered"),
        (expected[1], "no_answer"),
        (expected[1], "delivered"),
    ]
    assert len(log[-1]["response"]) <= 200
    assert "timed out" in log[1]["response"]
    assert log[1]["latency_ms"] < 3500


def test_rotation_signs_with_both_secrets_during_the_overlap(
    client, services, workspace, operator, member, deliverer
):
    with Receiver() as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        sid = uuid.UUID(made["id"])
        _, new_secret = services.webhooks.service.rotate_secret(workspace.id, sid, 3600)
        make_tasks(client, workspace, member[1], 1)
        got = receiver.wait_for(lambda r: len(r) == 1)[0]
    assert len([s for s in got.headers["webhook-signature"].split() if s.startswith("v1,")]) == 2
    Webhook(made["secret"]).verify(got.body, got.headers)
    Webhook(new_secret).verify(got.body, got.headers)
    # an overlap that has ended: the old secret no longer signs and leaves the store
    services.webhooks.service.rotate_secret(workspace.id, sid, 0)
    _wait(lambda: services.webhooks.store.get(sid).old_secret is None)


def test_the_address_is_checked_again_at_connect(client, services, workspace, operator, member):
    """Subscribed while 127.0.0.0/8 was allowed; a deliverer whose policy no
    longer allows it (as a rebinding DNS name would find) refuses to connect."""
    from kandev_es.webhooks.addresses import NetworkPolicy
    from kandev_es.webhooks.deliverer import Deliverer, Rules
    from kandev_es.webhooks.feed import StoreFeed

    with Receiver() as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 1)
        hooks = services.webhooks
        feed = StoreFeed(
            services.database, services.app.settled_rows, services.app.max_notification_id
        )
        strict = Deliverer(
            hooks.store, feed, hooks.key, Rules(NetworkPolicy((), allow_http=True), SHORT, 2.0)
        )
        thread = strict.start_thread()
        sid = uuid.UUID(made["id"])
        _wait(lambda: hooks.service.deliveries(workspace.id, sid, 5)["items"])
        strict.stop()
        thread.join(10)
        assert receiver.received == []
    attempt = hooks.service.deliveries(workspace.id, sid, 5)["items"][-1]
    assert attempt["result"] == "no_answer" and "127.0.0.1" in attempt["response"]


def logged(services, workspace, subscription_id, count, timeout=30.0):
    """The subscription's delivery log (newest first) once it holds ``count``
    attempts: a 2xx reaches it with the deliverer's next progress write, a
    moment after the receiver had the request."""
    sid = uuid.UUID(subscription_id)

    def items():
        return services.webhooks.service.deliveries(workspace.id, sid, 100)["items"]

    _wait(lambda: len(items()) >= count, timeout)
    return items()


def _wait(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_retry_after_is_honoured_and_the_lag_metric_shows_the_wait(
    client, services, workspace, operator, member, deliverer
):
    from kandev_es.webhooks import observed

    def behaviour(received, nth):
        return (503, {"retry-after": "2"}, b"busy") if nth == 1 else (200, {}, b"ok")

    def lag_of(sid):
        families = {f.name: f for f in observed.families(services.webhooks.store)}
        samples = families["kandev_webhook_lag_seconds"].samples
        return next(s.value for s in samples if s.labels["subscription"] == sid)

    with Receiver(behaviour) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 1)
        receiver.wait_for(lambda r: len(r) == 1)
        time.sleep(0.5)
        assert lag_of(made["id"]) > 0.4  # its one event waits for the retry
        got = receiver.wait_for(lambda r: len(r) == 2)
    waited = got[1].at - got[0].at
    assert 1.5 <= waited < 6, waited  # Retry-After: 2, not the schedule's 0.2 s
    assert got[0].webhook_id == got[1].webhook_id
    assert got[0].headers["webhook-timestamp"] <= got[1].headers["webhook-timestamp"]
    _wait(lambda: lag_of(made["id"]) == 0.0)


def test_an_answer_trickled_a_byte_at_a_time_is_cut_at_the_attempts_deadline(
    client, services, workspace, operator, member, deliverer
):
    """Each byte within the per-read timeout, the whole never: the attempt
    ends at KANDEV_WEBHOOK_TIMEOUT (2 s here), not when the bytes stop."""

    def behaviour(received, nth):
        if nth > 1:
            return 200, {}, b"ok"
        stream = received_streams[-1]
        with contextlib.suppress(OSError):
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 40:
                stream.write(bytes([byte]))
                stream.flush()
                time.sleep(0.25)
        return None

    received_streams: list = []
    with Receiver(behaviour) as receiver:
        receiver.on_request = received_streams.append
        made = subscribe(client, workspace, operator[1], receiver.url)
        make_tasks(client, workspace, member[1], 1)
        receiver.wait_for(lambda r: len(r) == 2, 30)
    log = services.webhooks.service.deliveries(workspace.id, uuid.UUID(made["id"]), 5)["items"]
    first = log[-1]
    assert first["result"] == "no_answer" and "timed out" in first["response"], first
    assert 1800 <= first["latency_ms"] < 4000, first  # 40 bytes at 0.25 s would take 10 s


def test_a_forget_blanks_the_logged_answers_to_its_tasks_deliveries(
    client, services, workspace, operator, member, deliverer
):
    """A receiver that echoes the title it got: the delivery log keeps a snippet of
    each answer, here the task's title. Forgetting the task blanks the
    snippets of its events' deliveries (another task's stay as they were)."""
    from tests.integration.test_forget import MARKER, forget

    def echo(received, nth):  # the title it got, as a receiver's answer might show it
        return 200, {}, json.dumps(received.event["data"]["title"]).encode()

    with Receiver(echo) as receiver:
        made = subscribe(client, workspace, operator[1], receiver.url)
        erased = create(client, member[1], title=f"{MARKER} erased").json["id"]
        create(client, member[1], title="kept words")
        log = logged(services, workspace, made["id"], 2)
        assert MARKER in repr(log) and "kept words" in repr(log)
        assert forget(client, operator[1], erased).status_code == 200
        receiver.wait_for(lambda r: len(r) >= 3)  # the forget's task.updated
    log = logged(services, workspace, made["id"], 3)
    assert MARKER not in repr(log) and "kept words" in repr(log), log
    with services.database.transaction() as tx:
        snippets = [str(row[0]) for row in tx.execute("SELECT snippet FROM webhook_deliveries")]
    assert len(snippets) == 3 and not any(MARKER in snippet for snippet in snippets)
