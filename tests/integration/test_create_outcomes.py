"""AC-TASKS-EXTERNAL-ID-001.1 / .2 / .3: one task per identity, four outcomes,
Found has no side effects."""

from __future__ import annotations

from tests.integration.helpers import create, start_unsettled_creation, task_created_count


def test_first_create_is_created_and_retry_is_found_settled(client, services, workspace, member):
    _, secret = member
    first = create(client, secret, external_id="JIRA-1", title="Fix login")
    retry = create(client, secret, external_id="JIRA-1", title="Fix login")
    assert first.status_code == retry.status_code == 200
    assert (first.json["outcome"], first.json["deduplicated"], first.json["creation_complete"]) == (
        "created",
        False,
        True,
    )
    assert (retry.json["outcome"], retry.json["deduplicated"], retry.json["creation_complete"]) == (
        "found_settled",
        True,
        True,
    )
    assert retry.json["id"] == first.json["id"]
    assert retry.json["external_id"] == "JIRA-1"
    assert task_created_count(services) == 1


def test_found_returns_existing_task_unchanged_even_when_payload_differs(
    client, services, workspace, member
):
    _, secret = member
    first = create(client, secret, external_id="E-1", title="Original", description="one")
    retry = create(client, secret, external_id="E-1", title="Different", description="two")
    assert retry.json["outcome"] == "found_settled"
    assert retry.json["title"] == "Original"
    assert retry.json["description"] == "one"
    assert retry.json["revision"] == first.json["revision"]


def test_found_writes_nothing_to_the_event_store(client, services, workspace, member):
    _, secret = member
    create(client, secret, external_id="E-2", title="Original")
    before = services.app.max_notification_id()
    for _ in range(3):
        assert create(client, secret, external_id="E-2", title="x").json["outcome"] == (
            "found_settled"
        )
    assert services.app.max_notification_id() == before


def test_found_unsettled_identifies_diagnostic_state_without_a_handle(
    client, services, workspace, member
):
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "E-3")
    before = services.app.max_notification_id()
    answer = create(client, secret, external_id="E-3", title="Retry")
    assert answer.status_code == 200
    assert answer.json["outcome"] == "found_unsettled"
    assert answer.json["deduplicated"] is True
    assert answer.json["creation_complete"] is False
    assert answer.json["id"] == str(in_flight.id)
    assert answer.json["state"] == "preparing"
    assert "never release" in answer.json["advice"].lower()
    assert "handle" not in answer.json
    assert services.app.max_notification_id() == before


def test_creates_without_external_id_are_always_new_and_carry_none(client, workspace, member):
    _, secret = member
    one = create(client, secret, title="Same")
    two = create(client, secret, title="Same")
    assert one.json["outcome"] == two.json["outcome"] == "created"
    assert one.json["id"] != two.json["id"]
    assert "external_id" not in one.json
    assert one.json["deduplicated"] is False and one.json["creation_complete"] is True


def test_empty_or_whitespace_external_id_means_absent(client, workspace, member):
    _, secret = member
    answer = create(client, secret, external_id="  \u00a0 ", title="No identity")
    assert answer.json["outcome"] == "created"
    assert "external_id" not in answer.json


def test_identity_is_case_sensitive_and_byte_exact(client, workspace, member):
    _, secret = member
    upper = create(client, secret, external_id="ABC", title="upper")
    lower = create(client, secret, external_id="abc", title="lower")
    nfc = create(client, secret, external_id="caf\u00e9", title="nfc")
    nfd = create(client, secret, external_id="cafe\u0301", title="nfd")
    assert {upper.json["outcome"], lower.json["outcome"]} == {"created"}
    assert upper.json["id"] != lower.json["id"]
    assert nfc.json["outcome"] == nfd.json["outcome"] == "created"
    assert nfc.json["id"] != nfd.json["id"]
    assert nfd.json["external_id"] == "cafe\u0301"


def test_surrounding_whitespace_is_trimmed_to_the_same_identity(client, workspace, member):
    _, secret = member
    first = create(client, secret, external_id="WEBHOOK-7", title="t")
    padded = create(client, secret, external_id="\u2003WEBHOOK-7  ", title="t")
    assert padded.json["outcome"] == "found_settled"
    assert padded.json["id"] == first.json["id"]


def test_same_external_id_in_two_workspaces_is_two_identities(client, services, admin):
    _, secret = admin
    one = services.workspaces.open("one")
    two = services.workspaces.open("two", "TWO")
    a = create(client, secret, workspace_id=str(one.id), external_id="X", title="a")
    b = create(client, secret, workspace_id=str(two.id), external_id="X", title="b")
    assert a.json["outcome"] == b.json["outcome"] == "created"
    assert a.json["id"] != b.json["id"]
    assert b.json["identifier"] == "TWO-1"


def test_every_task_carries_an_office_identifier_from_a_counter(client, workspace, member):
    _, secret = member
    identifiers = [create(client, secret, title=f"t{i}").json["identifier"] for i in range(3)]
    assert identifiers == ["KAN-1", "KAN-2", "KAN-3"]
    # A Found consumes no number.
    create(client, secret, external_id="K", title="k")
    create(client, secret, external_id="K", title="k")
    assert create(client, secret, title="next").json["identifier"] == "KAN-5"


def test_invalid_external_id_is_a_typed_400_and_changes_nothing(
    client, services, workspace, member
):
    _, secret = member
    before = services.app.max_notification_id()
    for bad in ["tab\there", "\nleading-newline", "x" * 256, "\u20ac" * 86, 42, ["a"]]:
        answer = create(client, secret, external_id=bad, title="t")
        assert answer.status_code == 400, bad
        assert answer.json["error"] == "invalid_external_id"
    assert services.app.max_notification_id() == before


def test_malformed_json_is_400_before_anything_else(client, services, member):
    _, secret = member
    before = services.app.max_notification_id()
    for raw in [b"{not json", b"[1, 2]", b"\"text\"", b"\xff\xfe"]:
        answer = client.post(
            "/api/v1/tasks",
            data=raw,
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
        assert answer.status_code == 400
        assert answer.json["error"] == "malformed_json"
    unauthenticated = client.post("/api/v1/tasks", data=b"{broken")
    assert unauthenticated.status_code == 400
    assert services.app.max_notification_id() == before


def test_request_validation_failure_on_a_miss_is_422_and_writes_nothing(
    client, services, workspace, member
):
    _, secret = member
    before = services.app.max_notification_id()
    answer = create(client, secret, external_id="NEW-1", title="   ")
    assert answer.status_code == 422
    assert answer.json["error"] == "validation_failed"
    assert services.app.max_notification_id() == before
    # The identity is still free: a valid create gets it.
    assert create(client, secret, external_id="NEW-1", title="ok").json["outcome"] == "created"
