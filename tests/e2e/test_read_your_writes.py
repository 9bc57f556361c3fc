"""Read your writes on any node (docs/architecture.md: Inline projections):
two `kandev-es serve` processes on one store (PostgreSQL: one database;
SQLite: one file). Once a create answers 200 on either node, a list by its
external ID and the workspace's feed show it, on that node and on the other,
at once: the read models and feed rows committed with the events."""

from __future__ import annotations

from pathlib import Path

from kandev_es.config import Settings
from tests.support.served import ServedProcess, http

CREATES = 6


def test_a_create_is_listed_and_in_the_feed_on_both_nodes_as_soon_as_it_answers(
    settings: Settings, tmp_path: Path
) -> None:
    first = ServedProcess(settings, tmp_path / "first", workers=1)
    second = None
    try:
        second = ServedProcess(settings, tmp_path / "second", workers=1)
        token, workspace = first.token, first.workspace_id
        nodes = (first, second)
        cursors = {node.base: 0 for node in nodes}
        for i in range(CREATES):
            writer = nodes[i % 2]
            made = http("POST", f"{writer.base}/api/v1/tasks", token,
                        {"workspace_id": workspace, "external_id": f"RYW-{i}", "title": "t"})
            assert made.status == 200 and made.body["outcome"] == "created", made.body
            for node in nodes:  # right after the answer: no wait, no retry
                listed = http("GET", f"{node.base}/api/v1/workspaces/{workspace}/tasks"
                              f"?external_id=RYW-{i}", token)
                assert [t["id"] for t in listed.body["items"]] == [made.body["id"]], node.base
                feed = http("GET", f"{node.base}/api/v1/workspaces/{workspace}/events"
                            f"?after={cursors[node.base]}", token)
                assert [(e["type"], e["subject"]) for e in feed.body["items"]] == [
                    ("task.created", made.body["id"])], node.base
                cursors[node.base] = feed.body["next_cursor"]
    finally:
        if second is not None:
            second.stop()
        first.stop()
