"""Schema attestation (AC-1): before any external-ID request is served, prove
that the live schema compares external IDs byte-exactly — collation "C" on
PostgreSQL, BINARY on SQLite — on the column and on its unique index."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kandev_es.storage.database import Database
from kandev_es.storage.schema import EXTERNAL_ID_TABLES, IDENTITY_INDEX

EXPECTED = {"postgres": "C", "sqlite": "BINARY"}

_PG_COLUMN = (
    "SELECT coll.collname FROM pg_attribute a"
    " JOIN pg_class t ON t.oid = a.attrelid"
    " JOIN pg_namespace n ON n.oid = t.relnamespace"
    " LEFT JOIN pg_collation coll ON coll.oid = a.attcollation"
    " WHERE n.nspname = current_schema() AND t.relname = ? AND a.attname = 'external_id'"
)
_PG_INDEX = (
    "SELECT coll.collname, i.indisunique FROM pg_index i"
    " JOIN pg_class ic ON ic.oid = i.indexrelid"
    " JOIN pg_namespace n ON n.oid = ic.relnamespace"
    " CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS k(attnum, collid)"
    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    " LEFT JOIN pg_collation coll ON coll.oid = k.collid"
    " WHERE n.nspname = current_schema() AND ic.relname = ? AND a.attname = 'external_id'"
)
_SQLITE_COLUMN = re.compile(r"\bexternal_id\s+TEXT(?:\s+COLLATE\s+\"?(\w+)\"?)?", re.IGNORECASE)


@dataclass
class Attestation:
    backend: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def attest_schema(database: Database) -> Attestation:
    result = Attestation(database.backend)
    expected = EXPECTED[database.backend]
    try:
        if database.backend == "postgres":
            _attest_postgres(database, expected, result)
        else:
            _attest_sqlite(database, expected, result)
    except Exception as error:  # an unreadable catalogue is a failed attestation
        result.problems.append(f"schema could not be inspected: {error}")
    return result


def _attest_postgres(database: Database, expected: str, result: Attestation) -> None:
    with database.transaction() as tx:
        for table in EXTERNAL_ID_TABLES:
            rows = tx.execute(_PG_COLUMN, (table,))
            if not rows:
                result.problems.append(f"{table}.external_id is missing")
            elif rows[0][0] != expected:
                result.problems.append(
                    f"{table}.external_id has collation {rows[0][0]!r}, expected {expected!r}"
                )
        rows = tx.execute(_PG_INDEX, (IDENTITY_INDEX,))
        _check_index(rows, expected, result)


def _attest_sqlite(database: Database, expected: str, result: Attestation) -> None:
    with database.transaction() as tx:
        for table in EXTERNAL_ID_TABLES:
            rows = tx.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            )
            match = _SQLITE_COLUMN.search(rows[0][0]) if rows else None
            if match is None:
                result.problems.append(f"{table}.external_id is missing")
                continue
            collation = (match.group(1) or "BINARY").upper()
            if collation != expected:
                result.problems.append(
                    f"{table}.external_id has collation {collation!r}, expected {expected!r}"
                )
        unique = {
            row[1]: bool(row[2]) for row in tx.execute("PRAGMA index_list(identities_view)")
        }
        columns = tx.execute(f"PRAGMA index_xinfo({IDENTITY_INDEX})")
        is_unique = unique.get(IDENTITY_INDEX, False)
        rows = [(row[4], is_unique) for row in columns if row[2] == "external_id"]
        _check_index(rows, expected, result)


def _check_index(rows: list[tuple[object, ...]], expected: str, result: Attestation) -> None:
    if not rows:
        result.problems.append(f"unique index {IDENTITY_INDEX} on external_id is missing")
        return
    collation, unique = rows[0][0], rows[0][1]
    if not unique:
        result.problems.append(f"index {IDENTITY_INDEX} is not unique")
    if collation != expected:
        result.problems.append(
            f"index {IDENTITY_INDEX} has collation {collation!r}, expected {expected!r}"
        )


class AttestationGuard:
    """Holds the latest attestation; external-ID traffic asks it first."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self.current = attest_schema(database)

    def refresh(self) -> Attestation:
        self.current = attest_schema(self._database)
        return self.current

    def require(self) -> None:
        from kandev_es.errors import SchemaNotAttested

        if not self.current.ok:
            raise SchemaNotAttested(
                "external-ID traffic refused: schema attestation failed",
                problems=self.current.problems,
            )
