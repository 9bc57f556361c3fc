"""Task reads and edits after creation: get, list (read model), patch with an
immutable external_id, archive keeps the identity, delete frees it."""

from __future__ import annotations

import uuid

from kandev_es.bootstrap import bootstrap
from tests.conftest import bearer
from tests.integration.helpers import create, start_unsettled_creation


def test_get_task_reads_own_write_with_etag(client, member):
    _, secret = member
    task = create(client, secret, external_id="G-1", title="t").json
    answer = client.get(f"/api/v1/tasks/{task['id']}", headers=bearer(secret))
    assert answer.status_code == 200
    assert answer.json["external_id"] == "G-1"
    assert answer.headers["ETag"] == '"1"'


def test_patch_edits_fields_and_bumps_revision(client, member):
    _, secret = member
    task = create(client, secret, external_id="P-1", title="old").json
    answer = client.patch(
        f"/api/v1/tasks/{task['id']}",
        json={"title": "new", "workflow_step": "review"},
        headers=bearer(secret),
    )
    assert answer.status_code == 200
    assert answer.json["title"] == "new" and answer.json["workflow_step"] == "review"
    assert answer.json["revision"] == 2
    # A retry of the original create still finds the (edited) task; it never patches.
    retry = create(client, secret, external_id="P-1", title="old")
    assert retry.json["title"] == "new"


def test_a_found_answers_the_task_as_it_is_now_after_an_edit_elsewhere(
    client, services, settings, member
):
    """Found answers are built once per task snapshot and replayed: an edit,
    here committed by another process on the same store, shows in the very
    next retry, and until then every retry gets the same bytes."""
    principal, secret = member
    task = create(client, secret, external_id="P-9", title="old").json
    first, second = (create(client, secret, external_id="P-9", title="old") for _ in range(2))
    assert first.json["outcome"] == "found_settled" and first.json["revision"] == 1
    assert first.get_data() == second.get_data()
    elsewhere = bootstrap(settings.with_overrides(create_tables=False))
    try:
        elsewhere.tasks.patch(principal, uuid.UUID(task["id"]), {"title": "new"})
    finally:
        elsewhere.close()
    retry = create(client, secret, external_id="P-9", title="old")
    assert retry.json["outcome"] == "found_settled"
    assert (retry.json["title"], retry.json["revision"]) == ("new", 2)
    assert retry.json["updated_at"] != first.json["updated_at"]


def test_external_id_is_immutable(client, services, member):
    _, secret = member
    task = create(client, secret, external_id="P-2", title="t").json
    before = services.app.max_notification_id()
    for value in ["P-3", "P-2", None]:
        answer = client.patch(
            f"/api/v1/tasks/{task['id']}", json={"external_id": value}, headers=bearer(secret)
        )
        assert answer.status_code == 400
        assert answer.json["error"] == "external_id_immutable"
    assert services.app.max_notification_id() == before


def test_patch_validation_and_if_match(client, services, member):
    _, secret = member
    task = create(client, secret, title="t").json
    url = f"/api/v1/tasks/{task['id']}"
    assert client.patch(url, json={"title": ""}, headers=bearer(secret)).status_code == 422
    assert client.patch(url, json={"owner": "x"}, headers=bearer(secret)).status_code == 422
    assert (
        client.patch(url, json={"workflow_step": "nowhere"}, headers=bearer(secret)).status_code
        == 422
    )
    stale = client.patch(
        url, json={"title": "x"}, headers={**bearer(secret), "If-Match": '"7"'}
    )
    assert stale.status_code == 412
    fresh = client.patch(url, json={"title": "x"}, headers={**bearer(secret), "If-Match": '"1"'})
    assert fresh.status_code == 200



def test_an_if_match_beyond_a_stored_revision_is_a_typed_400(client, services, member):
    """If-Match takes a revision in the stored integer range (0..2^63-1, like a
    feed cursor): 2^63, a sign or a non-digit is 400 bad_request and changes
    nothing; the largest stored value is well formed, only stale (412)."""
    _, secret = member
    task = create(client, secret, title="t").json
    url = f"/api/v1/tasks/{task['id']}"
    before = services.app.max_notification_id()
    for value in [str(2**63), f'"{2**63}"', "1" * 20, "-1", "+1", "1.0", "\u0661"]:
        answer = client.patch(
            url, json={"title": "x"}, headers={**bearer(secret), "If-Match": value}
        )
        assert (answer.status_code, answer.json["error"]) == (400, "bad_request"), value
    largest = client.patch(
        url, json={"title": "x"}, headers={**bearer(secret), "If-Match": str(2**63 - 1)}
    )
    assert largest.status_code == 412
    assert services.app.max_notification_id() == before

def test_archive_keeps_the_identity(client, member):
    _, secret = member
    task = create(client, secret, external_id="A-1", title="t").json
    archived = client.post(f"/api/v1/tasks/{task['id']}/archive", headers=bearer(secret))
    assert archived.status_code == 200 and archived.json["archived"] is True
    retry = create(client, secret, external_id="A-1", title="t")
    assert retry.json["outcome"] == "found_settled"
    assert retry.json["id"] == task["id"] and retry.json["archived"] is True


def test_delete_frees_the_identity(client, operator):
    _, secret = operator
    task = create(client, secret, external_id="D-1", title="t").json
    assert client.delete(f"/api/v1/tasks/{task['id']}", headers=bearer(secret)).status_code == 204
    assert client.get(f"/api/v1/tasks/{task['id']}", headers=bearer(secret)).status_code == 404
    again = create(client, secret, external_id="D-1", title="second life")
    assert again.json["outcome"] == "created"
    assert again.json["id"] != task["id"]


def test_unsettled_task_cannot_be_edited_or_deleted_by_callers(
    client, services, workspace, member
):
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "U-1")
    before = services.app.max_notification_id()
    url = f"/api/v1/tasks/{in_flight.id}"
    assert client.delete(url, headers=bearer(secret)).status_code == 409
    assert client.patch(url, json={"title": "x"}, headers=bearer(secret)).status_code == 409
    assert client.post(url + "/archive", headers=bearer(secret)).status_code == 409
    assert services.app.max_notification_id() == before


def test_list_is_paged_and_filters_by_external_id(client, services, workspace, member):
    _, secret = member
    for i in range(5):
        create(client, secret, external_id=f"L-{i}", title=f"t{i}")
    create(client, secret, title="anonymous")
    services.projections.catch_up()
    url = f"/api/v1/workspaces/{workspace.id}/tasks"

    page = client.get(url, query_string={"limit": 4}, headers=bearer(secret)).json
    assert len(page["items"]) == 4 and page["next_cursor"] is not None
    rest = client.get(
        url, query_string={"limit": 4, "after": page["next_cursor"]}, headers=bearer(secret)
    ).json
    assert len(rest["items"]) == 2 and rest["next_cursor"] is None
    titles = [t["title"] for t in page["items"] + rest["items"]]
    assert titles == ["t0", "t1", "t2", "t3", "t4", "anonymous"]

    only = client.get(url, query_string={"external_id": "L-3"}, headers=bearer(secret)).json
    assert [t["title"] for t in only["items"]] == ["t3"]
    case = client.get(url, query_string={"external_id": "l-3"}, headers=bearer(secret)).json
    assert case["items"] == []
    bad = client.get(url, query_string={"limit": 0}, headers=bearer(secret))
    assert bad.status_code == 422


def test_list_reflects_edits_archive_and_delete_after_projection(
    client, services, workspace, operator
):
    _, secret = operator
    keep = create(client, secret, external_id="K-1", title="keep").json
    gone = create(client, secret, external_id="K-2", title="gone").json
    client.patch(f"/api/v1/tasks/{keep['id']}", json={"title": "kept"}, headers=bearer(secret))
    client.post(f"/api/v1/tasks/{keep['id']}/archive", headers=bearer(secret))
    client.delete(f"/api/v1/tasks/{gone['id']}", headers=bearer(secret))
    services.projections.catch_up()
    url = f"/api/v1/workspaces/{workspace.id}/tasks"
    items = client.get(url, headers=bearer(secret)).json["items"]
    assert [(t["title"], t["archived"], t["revision"]) for t in items] == [("kept", True, 3)]
    live = client.get(url, query_string={"include_archived": "false"}, headers=bearer(secret))
    assert live.json["items"] == []
