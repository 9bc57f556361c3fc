"""The benchmark's PostgreSQL (a throwaway cluster or KANDEV_BENCH_DATABASE_URL),
its durability settings, and the raw psycopg baselines every rate stands beside."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from benchlib.common import REPO
from kandev_es.config import postgres_target


@contextlib.contextmanager
def database(tmp: Path) -> Iterator[str]:
    given = os.environ.get("KANDEV_BENCH_DATABASE_URL")
    if given:
        yield given
        return
    script = [sys.executable, str(REPO / "scripts" / "start-postgres")]
    directory = str(tmp / "pg")
    started = subprocess.run(
        # Durable (fsync and synchronous commit on), as a production database
        # runs: a commit then costs what it really costs, for both sides.
        [*script, "start", "--dir", directory, "--durable"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=180, check=False,
    )
    if started.returncode != 0:
        raise SystemExit(f"scripts/start-postgres failed:\n{started.stderr}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            [*script, "stop", "--dir", directory],
            capture_output=True, stdin=subprocess.DEVNULL, timeout=120, check=False,
        )


def durability(url: str) -> dict[str, str]:
    """The settings that decide what a commit costs, printed with the ratios."""
    with psycopg.connect(postgres_target(url).conninfo, autocommit=True) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit")
        }


def connect(url: str, schema: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(postgres_target(url).conninfo, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


RAW_DDL = (
    "CREATE TABLE raw_tasks (id uuid PRIMARY KEY, workspace_id uuid NOT NULL,"
    ' external_id text COLLATE "C", dto jsonb NOT NULL)'
)


RAW_DTO = json.dumps({"title": "bench", "description": "", "workflow": "default"})


def prepare_raw(url: str, schema: str) -> uuid.UUID:
    """A table comparable to a task read: one row per task, keyed by UUID."""
    with connect(url, schema) as conn:
        conn.execute(RAW_DDL)
        ids = [uuid.uuid4() for _ in range(2000)]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO raw_tasks VALUES (%s, %s, %s, %s)",
                [(i, ids[0], f"RAW-{i}", RAW_DTO) for i in ids],
            )
        return ids[len(ids) // 2]


def raw_select(conn: psycopg.Connection[Any], key: uuid.UUID) -> Callable[[], None]:
    def run() -> None:
        row = conn.execute("SELECT dto FROM raw_tasks WHERE id = %s", (key,)).fetchone()
        assert row is not None

    return run


def raw_insert_tx(conn: psycopg.Connection[Any]) -> Callable[[], None]:
    workspace = uuid.uuid4()

    def run() -> None:
        with conn.transaction():
            task = uuid.uuid4()
            conn.execute(
                "INSERT INTO raw_tasks VALUES (%s, %s, %s, %s)",
                (task, workspace, f"RAW-{task}", RAW_DTO),
            )

    return run


def prepare_raw_key(url: str, schema: str) -> uuid.UUID:
    with connect(url, schema) as conn:
        row = conn.execute("SELECT id FROM raw_tasks ORDER BY id LIMIT 1").fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def counters(url: str) -> tuple[int, int]:
    """(xact_commit of this database, next transaction id), once the backends
    just closed have flushed their statistics."""
    time.sleep(0.5)  # closed backends flush their statistics on exit
    return stat_counters(postgres_target(url).conninfo)


def stat_counters(conninfo: str) -> tuple[int, int]:
    """(xact_commit of this database as last flushed, next transaction id)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
