"""What each statement cost PostgreSQL over a measurement, when the cluster
has pg_stat_statements (shared_preload_libraries and CREATE EXTENSION in the
bench's admin database; the bench's own throwaway cluster does not load it):
calls, execution time and shared buffers per statement, as deltas between two
readings. Buffers and calls hardly depend on the machine's load, unlike
throughput and time, so they tell what a change did on a shared machine."""

from __future__ import annotations

from typing import Any

import psycopg

from kandev_es.config import postgres_target

# Summed over users and nesting levels (a statement run inside a function is
# counted apart with track = all): one row per normalised statement.
READ = (
    "SELECT queryid, min(left(regexp_replace(query, '\\s+', ' ', 'g'), 160)),"
    " sum(calls), sum(total_exec_time), sum(shared_blks_hit + shared_blks_read),"
    " bool_and(NOT toplevel)"
    " FROM pg_stat_statements GROUP BY queryid"
)
SHOWN = 16  # statements reported per measurement, the costliest first


class Statements:
    """Readings of pg_stat_statements on ``admin_url``'s cluster; ``None``
    readings when the extension is not there."""

    def __init__(self, admin_url: str) -> None:
        self.conninfo = postgres_target(admin_url).conninfo
        try:
            self.read()
            self.available = True
        except psycopg.Error:
            self.available = False

    def read(self) -> dict[int, tuple[str, int, float, int, bool]] | None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            rows = conn.execute(READ).fetchall()
        return {
            int(r[0]): (str(r[1]), int(r[2]), float(r[3]), int(r[4]), bool(r[5]))
            for r in rows
            if r[0] is not None
        }

    def reading(self) -> dict[int, tuple[str, int, float, int, bool]] | None:
        return self.read() if self.available else None


def statement_deltas(
    before: dict[int, tuple[str, int, float, int, bool]] | None,
    after: dict[int, tuple[str, int, float, int, bool]] | None,
    per: int,
) -> list[dict[str, Any]] | None:
    """The SHOWN statements that took the most execution time between two
    readings, each with its calls, ms, and shared buffers in total and per
    ``per`` (the Created of the measurement); nested ones marked. First, the
    sum over every top-level statement (``(all top-level)``)."""
    if before is None or after is None:
        return None
    rows: list[dict[str, Any]] = []
    for queryid, (text, calls, ms, blocks, nested) in after.items():
        _, calls0, ms0, blocks0, _ = before.get(queryid, (text, 0, 0.0, 0, nested))
        if calls - calls0 <= 0:
            continue
        rows.append(_row(text, nested, calls - calls0, ms - ms0, blocks - blocks0, per))
    rows.sort(key=lambda row: -row["ms"])
    top = [row for row in rows if not row["nested"]]
    total = _row(
        "(all top-level)",
        False,
        sum(row["calls"] for row in top),
        sum(row["ms"] for row in top),
        sum(row["buffers"] for row in top),
        per,
    )
    return [total, *rows[:SHOWN]]


def _row(text: str, nested: bool, calls: int, ms: float, blocks: int, per: int) -> dict[str, Any]:
    return {
        "statement": text,
        "nested": nested,
        "calls": calls,
        "ms": round(ms, 1),
        "buffers": blocks,
        "ms_per_call": round(ms / max(calls, 1), 3),
        "buffers_per_call": round(blocks / max(calls, 1), 1),
        "calls_per_created": round(calls / max(per, 1), 3),
        "ms_per_created": round(ms / max(per, 1), 4),
        "buffers_per_created": round(blocks / max(per, 1), 1),
    }
