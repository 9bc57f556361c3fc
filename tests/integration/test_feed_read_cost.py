"""What the feed's reads cost PostgreSQL does not grow with the events table
(issue 48): the feed reader's statement (``Horizon.following_sql``, several a
second while streams are open) and the writers' head (``Writers.head_sql``:
every JSON feed page, a follower's catch-up, a webhook deliverer's page) read
a few index pages however many events are stored. Each is explained with
ANALYZE and BUFFERS as psycopg runs it, prepared: the generic plan it settles
on after five runs and the custom one, over 20,000 stored events.

Both once read the whole table: the reader's "has a watched token or workspace
moved" as a hash join over a sequential scan of the events (an EXISTS the
planner expected to end at its first match, which it has not when nothing
moved: ~1,100 buffers a pass in a bench run), the head's max(notification_id)
as a sequential scan (the planner's index shortcut for max does not apply
beside the statement's CTEs: ~1,000 buffers a call)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kandev_es.services.fanout import FOLLOWING_PAGE, PAGE, StreamAccess

pytestmark = pytest.mark.postgres_only

FILLER = 20_000
AGGREGATES = 100  # of 200 events each: the planner expects a watched id to match many
MOST_BUFFERS = 60  # a few index descents and the page's rows; the table is ~1,000 pages


def _buffers(conn: psycopg.Connection[Any], statement: str, params: Any, mode: str) -> int:
    """Shared buffers the statement reads when run prepared under ``mode``."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    if isinstance(params, dict):
        text = re.sub(r"%\((\w+)\)s", number, statement)
        values = [params[name] for name in names]
    else:
        text, values = statement.replace("%s", "$1"), list(params)
    conn.execute(f"SET plan_cache_mode = {mode}")
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE cost AS {text.replace('%%', '%')}")
    execute = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE cost({})").format(
        sql.SQL(", ").join(sql.Literal(value) for value in values)
    )
    row = conn.execute(execute).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.fixture
def stored(settings: Any, services: Any) -> psycopg.Connection[Any]:
    """20,000 more events in the store (100 aggregates of their own, neither
    in the feed nor watched), analysed."""
    conn = psycopg.connect(settings.postgres.schema_conninfo, autocommit=True)
    conn.execute(
        "INSERT INTO kandev_events (originator_id, originator_version, topic, state)"
        " SELECT o.id, v, 'test.filler', '\\x'::bytea"
        " FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, %s)) AS o,"
        " generate_series(1, %s) AS v",
        (AGGREGATES, FILLER // AGGREGATES),
    )
    conn.execute("ANALYZE kandev_events")
    return conn


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_feed_readers_statements_read_a_few_pages_of_a_large_log(
    stored, services, workspace, member, mode
):
    _, secret = member
    access = StreamAccess(services.app)
    _, watched = access.checked([access.grant(secret, workspace.id)])
    assert len(watched) == 2 and all(watched.values())  # the token and the workspace
    recorder = services.app.recorder
    schema = recorder._sequence_prefix[:-1]
    head = services.app.max_notification_id()
    following = recorder.horizon.following_sql(FOLLOWING_PAGE.format(schema=schema))
    params = recorder.horizon.following_params(
        {"after": head, "workspaces": [workspace.id], "limit": PAGE}, watched
    )
    assert _buffers(stored, following, params, mode) <= MOST_BUFFERS
    moved = {key: version - 1 for key, version in watched.items()}
    params = recorder.horizon.following_params(
        {"after": head, "workspaces": [workspace.id], "limit": PAGE}, moved
    )
    assert _buffers(stored, following, params, mode) <= MOST_BUFFERS
    writers = recorder.writers.head_sql
    assert _buffers(stored, writers, (recorder._table_sql,), mode) <= MOST_BUFFERS
