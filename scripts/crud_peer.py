"""A CRUD peer for scripts/bench: idempotent task creation without event sourcing.

What a team would write for "create a task once per (workspace, external_id)"
with plain Flask and psycopg: a lookup by the unique key, then ONE transaction
inserting the task row (unique index on (workspace_id, external_id)), an office
number from a sequence and an outbox row; a unique violation means a racing
caller won, so the existing row is returned (Found). The bearer token is looked
up by its SHA-256 per request, as kandev-es does, so both sides pay for auth.

Served by the same gunicorn config as kandev-es (http/gunicorn.conf.py: the same
worker class, KANDEV_WORKERS and KANDEV_THREADS; its pool sized by KANDEV_POOL_SIZE
and KANDEV_PG_CONNECT_TIMEOUT as kandev-es's event store):

    gunicorn -c http/gunicorn.conf.py --pythonpath scripts 'crud_peer:create_app()'

Environment (read here: this is a benchmark peer, not part of kandev_es):
    PEER_DATABASE_URL  a plain libpq URL          (required)
    PEER_SCHEMA        schema holding its tables  (default "peer")

``python scripts/crud_peer.py init URL SCHEMA`` creates the schema and tables;
``python scripts/crud_peer.py token URL SCHEMA WORKSPACE`` prints a new token.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import uuid
from typing import Any

import psycopg
from flask import Flask, jsonify, request
from psycopg import errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

DDL = """
CREATE SCHEMA IF NOT EXISTS "{schema}";
SET search_path TO "{schema}";
CREATE SEQUENCE IF NOT EXISTS office_numbers;
CREATE TABLE IF NOT EXISTS peer_tokens (
    token_sha256 text PRIMARY KEY, workspace_id uuid NOT NULL);
CREATE TABLE IF NOT EXISTS peer_tasks (
    id uuid PRIMARY KEY, workspace_id uuid NOT NULL, external_id text COLLATE "C",
    office_number bigint NOT NULL, title text NOT NULL, description text NOT NULL,
    workflow text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE UNIQUE INDEX IF NOT EXISTS peer_tasks_identity
    ON peer_tasks (workspace_id, external_id);
CREATE TABLE IF NOT EXISTS peer_outbox (
    id bigserial PRIMARY KEY, task_id uuid NOT NULL, type text NOT NULL,
    payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
"""

SELECT_TASK = (
    "SELECT id, office_number FROM peer_tasks WHERE workspace_id = %s AND external_id = %s"
)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def init(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL.format(schema=schema).encode())


def issue_token(url: str, schema: str, workspace: str) -> str:
    token = secrets.token_urlsafe(24)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("INSERT INTO peer_tokens VALUES (%s, %s)", (digest(token), workspace))
    return token


def one(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.encode(), params).fetchone()


def reply(outcome: str, row: dict[str, Any], status: int = 200) -> Any:
    return jsonify(outcome=outcome, id=str(row["id"]), office_number=row["office_number"]), status


# The three steps of a create, named so that scripts/cost_sampler.py can time them.
def authenticate(conn: psycopg.Connection[Any], token: str) -> dict[str, Any] | None:
    return one(
        conn, "SELECT workspace_id FROM peer_tokens WHERE token_sha256 = %s",
        (digest(token),),
    )


def lookup(conn: psycopg.Connection[Any], workspace: Any, external_id: Any) -> Any:
    return one(conn, SELECT_TASK, (workspace, external_id))


def insert_task(
    conn: psycopg.Connection[Any], task: uuid.UUID, workspace: Any, external_id: Any,
    data: dict[str, Any],
) -> dict[str, Any] | None:
    with conn.transaction():
        row = one(
            conn,
            "INSERT INTO peer_tasks (id, workspace_id, external_id, office_number,"
            " title, description, workflow)"
            " VALUES (%s, %s, %s, nextval('office_numbers'), %s, %s, %s)"
            " RETURNING id, office_number",
            (task, workspace, external_id, data["title"],
             data.get("description", ""), data.get("workflow", "default")),
        )
        conn.execute(
            "INSERT INTO peer_outbox (task_id, type, payload)"
            " VALUES (%s, 'task.created', %s)",
            (task, Jsonb({"id": str(task), "title": data["title"]})),
        )
    return row


def create_app() -> Flask:
    url = os.environ["PEER_DATABASE_URL"]
    schema = os.environ.get("PEER_SCHEMA", "peer")
    # The database settings kandev-es reads (config.py, application.py): its
    # event store, which every create and Found goes through, pools
    # KANDEV_POOL_SIZE (default 5) connections plus as many overflow per worker
    # and waits KANDEV_PG_CONNECT_TIMEOUT (default 1) s for one; the peer's one
    # pool the same (it was sized by KANDEV_THREADS, which no longer is the
    # request thread count: the server runs KANDEV_THREADS + KANDEV_MAX_STREAMS).
    size = int(os.environ.get("KANDEV_POOL_SIZE") or 5)
    wait = float(os.environ.get("KANDEV_PG_CONNECT_TIMEOUT") or 1)
    pool = ConnectionPool(
        url, min_size=1, max_size=2 * size, timeout=wait, open=True,
        kwargs={"options": f"-c search_path={schema}"},
    )
    app = Flask("crud_peer")

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(status="ok")

    @app.post("/api/v1/tasks")
    def create() -> Any:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        data = request.get_json(silent=True)
        if not isinstance(data, dict) or not isinstance(data.get("title"), str):
            return jsonify(error="invalid_request"), 400
        external_id = data.get("external_id")
        with pool.connection() as conn:
            conn.autocommit = True
            owner = authenticate(conn, token)
            if owner is None or str(owner["workspace_id"]) != data.get("workspace_id"):
                return jsonify(error="unauthorized"), 401
            workspace = owner["workspace_id"]
            if external_id is not None:
                found = lookup(conn, workspace, external_id)
                if found is not None:
                    return reply("found", found)
            task = uuid.uuid4()
            try:
                row = insert_task(conn, task, workspace, external_id, data)
            except errors.UniqueViolation:
                # A racing caller committed the same identity first.
                found = lookup(conn, workspace, external_id)
                assert found is not None
                return reply("found", found)
            assert row is not None
            return reply("created", row)

    @app.post("/api/v1/tasks/batch")
    def create_batch() -> Any:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        data = request.get_json(silent=True)
        tasks = data.get("tasks") if isinstance(data, dict) else None
        if not isinstance(tasks, list) or not all(
            isinstance(t, dict) and isinstance(t.get("title"), str) for t in tasks
        ):
            return jsonify(error="invalid_request"), 400
        with pool.connection() as conn:
            conn.autocommit = True
            owner = authenticate(conn, token)
            if owner is None or str(owner["workspace_id"]) != data.get("workspace_id"):
                return jsonify(error="unauthorized"), 401
            return jsonify(results=insert_batch(conn, owner["workspace_id"], tasks))

    return app


BATCH_INSERT = """
WITH input AS (
    SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[])
        WITH ORDINALITY AS t(id, external_id, title, description, ord)),
ins AS (
    INSERT INTO peer_tasks (id, workspace_id, external_id, office_number, title,
                            description, workflow)
    SELECT id, %s, external_id, nextval('office_numbers'), title, description, 'default'
    FROM input ORDER BY ord
    ON CONFLICT (workspace_id, external_id) DO NOTHING
    RETURNING id, external_id, office_number),
outbox AS (
    INSERT INTO peer_outbox (task_id, type, payload)
    SELECT id, 'task.created', jsonb_build_object('id', id) FROM ins)
SELECT id, external_id, office_number FROM ins
"""


def insert_batch(
    conn: psycopg.Connection[Any], workspace: Any, tasks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A batch the way a CRUD service writes one: ONE INSERT ... SELECT FROM
    unnest ... ON CONFLICT DO NOTHING RETURNING (with its outbox rows), then
    the rows that were there already, found by their external IDs."""
    ids = [uuid.uuid4() for _ in tasks]
    external = [t.get("external_id") for t in tasks]
    with conn.transaction():
        made = conn.execute(BATCH_INSERT.encode(), (
            ids, external, [t["title"] for t in tasks],
            [t.get("description", "") for t in tasks], workspace,
        )).fetchall()
        created = {str(row[0]): row for row in made}
        held = [e for e, i in zip(external, ids, strict=True)
                if e is not None and str(i) not in created]
        found = {
            row[1]: row for row in conn.execute(
                "SELECT id, external_id, office_number FROM peer_tasks"
                " WHERE workspace_id = %s AND external_id = ANY(%s)", (workspace, held),
            ).fetchall()
        } if held else {}
    results = []
    for index, (task_id, external_id) in enumerate(zip(ids, external, strict=True)):
        row = created.get(str(task_id))
        outcome = "created" if row is not None else "found"
        row = row if row is not None else found.get(external_id)
        results.append({"index": index, "outcome": outcome,
                        "id": str(row[0]) if row else None,
                        "office_number": row[2] if row else None})
    return results


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "init":
        init(*rest)
    elif command == "token":
        print(issue_token(*rest))
    else:
        raise SystemExit(__doc__)
