"""Who holds the projection leader lock (projections/leadership.py), read from
outside the holders: PostgreSQL's pg_locks, Linux's /proc/locks for SQLite."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from kandev_es.projections.leadership import lock_key, lock_path

from kandev_es.config import Settings
from tests.conftest import postgres_admin_url


def lock_sessions(settings: Settings) -> list[tuple[int, int]]:
    """PostgreSQL: (backend pid, process pid) of each session holding the lock;
    the process pid is in the session's application_name."""
    assert settings.postgres is not None
    schema = settings.postgres.schema
    with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT l.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a"
            " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.database = (SELECT oid FROM pg_database"
            "  WHERE datname = current_database())"
            " AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
            lock_key(schema),
        ).fetchall()
    return sorted((int(backend), int(name.rsplit("-", 1)[1])) for backend, name in rows)


def lock_holders(settings: Settings) -> list[int]:
    """The pids of the processes holding the projection leader lock."""
    if settings.database_url:
        return sorted(process for _, process in lock_sessions(settings))
    return _flock_holders(lock_path(settings.sqlite_path))


# Each leading role's lock (PostgreSQL class; SQLite's file beside the database,
# named after the projection leader's).
ROLES = {"projections": b"kes1", "ledger": b"kes2", "webhooks": b"kes5"}


def role_holders(settings: Settings) -> dict[str, list[int]]:
    """{role: pids of the processes holding its leader lock} for the projection
    loop, the ledger sequencer and the webhook deliverer."""
    if settings.database_url:
        return _postgres_role_holders(settings)
    found = {}
    for role in ROLES:
        path = lock_path(settings.sqlite_path)
        if role != "projections":
            path = path.with_name(path.name.replace("projection", role.rstrip("s")))
        found[role] = _flock_holders(path)
    return found


def _postgres_role_holders(settings: Settings) -> dict[str, list[int]]:
    assert settings.postgres is not None
    _, objid = lock_key(settings.postgres.schema)
    with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT l.classid::bigint, a.application_name FROM pg_locks l"
            " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
            " AND l.granted AND l.database = (SELECT oid FROM pg_database"
            "  WHERE datname = current_database()) AND l.objid = %s AND l.objsubid = 2",
            (objid,),
        ).fetchall()
    found: dict[str, list[int]] = {role: [] for role in ROLES}
    for role, key in ROLES.items():
        for classid, name in rows:
            if classid == int.from_bytes(key, "big"):
                found[role].append(int(name.rsplit("-", 1)[1]))
    return {role: sorted(pids) for role, pids in found.items()}


def _flock_holders(path: Path) -> list[int]:
    if not path.exists():
        return []
    inode = f":{os.stat(path).st_ino} "
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # 1: FLOCK ADVISORY WRITE <pid> <maj:min:inode> 0 EOF
        if "FLOCK" in fields and "->" not in fields and inode in f"{fields[5]} ":
            holders.append(int(fields[4]))
    return sorted(holders)
