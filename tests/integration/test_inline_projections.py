"""Read models written in the save's transaction (docs/architecture.md: Inline
projections): a create is in the task list, the identity index and the feed
as soon as it answers, with no projection loop running; a read model that
refuses the save rolls the whole save back, with a typed error and a metric."""

from __future__ import annotations

import pytest

from kandev_es import metrics
from tests.conftest import bearer
from tests.integration.helpers import create

# A fault in one projection: its table refuses every row (a real trigger on the
# real table, so the database itself fails the statement mid-save).
FAULT = {
    "sqlite": (
        "CREATE TRIGGER refuse_feed BEFORE INSERT ON feed_events"
        " BEGIN SELECT RAISE(ABORT, 'injected feed fault'); END",
        "DROP TRIGGER refuse_feed",
    ),
    "postgres": (
        "CREATE FUNCTION refuse_feed() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'injected feed fault'; END $$;"
        " CREATE TRIGGER refuse_feed BEFORE INSERT ON feed_events"
        " FOR EACH ROW EXECUTE FUNCTION refuse_feed()",
        "DROP TRIGGER refuse_feed ON feed_events",
    ),
}


def _count(services, table: str) -> int:
    with services.database.transaction() as tx:
        return int(tx.execute(f"SELECT count(*) FROM {table}")[0][0])


def test_a_create_is_listed_found_and_in_the_feed_when_it_answers(client, services, member,
                                                                  workspace):
    _, secret = member
    assert not services.projections.leading  # no projection loop runs in this process
    made = create(client, secret, external_id="RYW-1", title="inline")
    assert made.status_code == 200 and made.json["outcome"] == "created"

    listed = client.get(f"/api/v1/workspaces/{workspace.id}/tasks?external_id=RYW-1",
                        headers=bearer(secret))
    assert [item["id"] for item in listed.json["items"]] == [made.json["id"]]
    feed = client.get(f"/api/v1/workspaces/{workspace.id}/events", headers=bearer(secret))
    assert [(e["type"], e["subject"]) for e in feed.json["items"]] == [
        ("task.created", made.json["id"])]
    with services.database.transaction() as tx:
        held = tx.execute("SELECT held, phase FROM identities_view WHERE external_id = ?",
                          ("RYW-1",))
    assert [(bool(h), p) for h, p in held] == [(True, "completed")]
    assert _count(services, "creations_view") == 0  # settled in its own save


def test_a_failing_projection_rolls_the_whole_save_back(client, services, member, workspace):
    _, secret = member
    refuse, allow = FAULT[services.database.backend]
    with services.database.transaction() as tx:
        tx.execute(refuse)
    failures = metrics.instruments().projection_failures
    failed_before = failures._value.get()
    head = services.app.max_notification_id()
    tables = ("tasks_view", "identities_view", "feed_tasks", "feed_events")
    rows = {table: _count(services, table) for table in tables}

    refused = create(client, secret, external_id="FAULT-1", title="refused")

    assert refused.status_code == 503, refused.json
    assert refused.json["error"] == "projection_failed"
    assert failures._value.get() == failed_before + 1
    assert services.app.max_notification_id() == head  # no event stored
    assert {table: _count(services, table) for table in tables} == rows
    lookup = client.get(f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id"
                        "?external_id=FAULT-1", headers=bearer(secret))
    assert lookup.status_code == 404

    with services.database.transaction() as tx:
        tx.execute(allow)
    again = create(client, secret, external_id="FAULT-1", title="refused")
    assert again.status_code == 200 and again.json["outcome"] == "created", again.json


@pytest.mark.postgres_only
def test_a_save_is_one_statement_on_postgresql(services, workspace):
    """The events and every read-model row of a create: one call of the save
    function (kandev_insert_events calls kandev_apply_views inside it)."""
    with services.database.transaction() as tx:
        body = tx.execute("SELECT prosrc FROM pg_proc WHERE proname = 'kandev_insert_events'"
                          " AND pronamespace = current_schema()::regnamespace")
    assert len(body) == 1 and "kandev_apply_views" in body[0][0]
