"""The tables of the tamper-evident history (docs/auditing.md) and the
statements over them; the sequencer and the proofs are in services/ledger.py.

- ``ledger_leaves``: leaf i of the Merkle log is event ``notification_id``
  (stream, version) with its chain hash, appended in settled global order.
- ``ledger_nodes``: every complete perfect subtree (level, index) -> hash,
  level 0 being the leaf hashes. Never updated once written, so a root or a
  proof at any size reads O(log n) rows.
- ``ledger_checkpoints``: the signed checkpoints (C2SP signed notes), by size.
- ``ledger_heads``, ``ledger_map_nodes``, ``ledger_map_state``: the map of
  stream heads as of the latest checkpoint (kandev_es_client.heads): each
  stream's last logged version and chain hash, the map's nodes (level 0: the
  non-empty buckets; level 16: the root) and the log size it describes.

Table names are fixed here; the stores' own search_path (PostgreSQL) or file
(SQLite) places them beside the events table."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kandev_es.storage.database import Transaction

# Array parameters packed straight into PostgreSQL's binary format (as the
# save's are, storage/recorders.py): psycopg's generic list dumper, a Python
# call per element, was a sixth of the sequencer's CPU over a batch import.


def _packed(columns: Iterable[Sequence[Any]], kinds: str) -> list[Any]:
    """Each column packed by its kind: i (bigint), u (uuid), b (bytea)."""
    return [_pack(kind, column) for column, kind in zip(columns, kinds, strict=True)]


def _pack(kind: str, values: Iterable[Any]) -> Any:
    # Imported here: psycopg (the postgres extra) is not there on SQLite alone.
    from kandev_es.storage.recorders import pack_byteas, pack_int8s, pack_uuids

    packers: dict[str, Callable[[list[Any]], bytes]] = {
        "i": pack_int8s, "u": pack_uuids, "b": pack_byteas,
    }
    return packers[kind](list(values))


SQLITE_DDL = (
    "CREATE TABLE IF NOT EXISTS ledger_leaves ("
    " leaf_index INTEGER PRIMARY KEY, notification_id INTEGER NOT NULL UNIQUE,"
    " originator_id TEXT NOT NULL, originator_version INTEGER NOT NULL,"
    " chain_hash BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_leaves_stream"
    " ON ledger_leaves (originator_id, originator_version)",
    "CREATE TABLE IF NOT EXISTS ledger_nodes ("
    " level INTEGER NOT NULL, node_index INTEGER NOT NULL, hash BLOB NOT NULL,"
    " PRIMARY KEY (level, node_index))",
    "CREATE TABLE IF NOT EXISTS ledger_checkpoints ("
    " tree_size INTEGER PRIMARY KEY, note TEXT NOT NULL, signed_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_heads ("
    " originator_id TEXT PRIMARY KEY, bucket INTEGER NOT NULL,"
    " originator_version INTEGER NOT NULL, chain_hash BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_heads_bucket ON ledger_heads (bucket)",
    "CREATE TABLE IF NOT EXISTS ledger_map_nodes ("
    " level INTEGER NOT NULL, node_index INTEGER NOT NULL, hash BLOB NOT NULL,"
    " PRIMARY KEY (level, node_index))",
    "CREATE TABLE IF NOT EXISTS ledger_map_state ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), tree_size INTEGER NOT NULL)",
    "INSERT INTO ledger_map_state (id, tree_size) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    "CREATE TABLE IF NOT EXISTS ledger_reanchors (signed_at REAL NOT NULL, note TEXT NOT NULL)",
)
POSTGRES_DDL = (
    "CREATE TABLE IF NOT EXISTS ledger_leaves ("
    " leaf_index BIGINT PRIMARY KEY, notification_id BIGINT NOT NULL UNIQUE,"
    " originator_id UUID NOT NULL, originator_version BIGINT NOT NULL,"
    " chain_hash BYTEA NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_leaves_stream"
    " ON ledger_leaves (originator_id, originator_version)",
    "CREATE TABLE IF NOT EXISTS ledger_nodes ("
    " level INTEGER NOT NULL, node_index BIGINT NOT NULL, hash BYTEA NOT NULL,"
    " PRIMARY KEY (level, node_index))",
    "CREATE TABLE IF NOT EXISTS ledger_checkpoints ("
    " tree_size BIGINT PRIMARY KEY, note TEXT NOT NULL, signed_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_heads ("
    " originator_id UUID PRIMARY KEY, bucket INTEGER NOT NULL,"
    " originator_version BIGINT NOT NULL, chain_hash BYTEA NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_heads_bucket ON ledger_heads (bucket)",
    "CREATE TABLE IF NOT EXISTS ledger_map_nodes ("
    " level INTEGER NOT NULL, node_index INTEGER NOT NULL, hash BYTEA NOT NULL,"
    " PRIMARY KEY (level, node_index))",
    "CREATE TABLE IF NOT EXISTS ledger_map_state ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), tree_size BIGINT NOT NULL)",
    "INSERT INTO ledger_map_state (id, tree_size) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    "CREATE TABLE IF NOT EXISTS ledger_reanchors ("
    " signed_at DOUBLE PRECISION NOT NULL, note TEXT NOT NULL)",
)

NodeKey = tuple[int, int]


def ledger_ddl(backend: str) -> tuple[str, ...]:
    return POSTGRES_DDL if backend == "postgres" else SQLITE_DDL


def stream_key(backend: str, stream_id: uuid.UUID) -> Any:
    """A stream id as the backend's events table stores it (SQLite: 32 hex)."""
    return stream_id if backend == "postgres" else stream_id.hex


def tree_head(tx: Transaction) -> tuple[int, int]:
    """(tree size, the notification id of the last leaf; 0 for none)."""
    rows = tx.execute(
        "SELECT leaf_index, notification_id FROM ledger_leaves"
        " ORDER BY leaf_index DESC LIMIT 1"
    )
    return (int(rows[0][0]) + 1, int(rows[0][1])) if rows else (0, 0)


def frontier_keys(size: int) -> list[NodeKey]:
    """The perfect subtrees whose hashes make the root of ``size`` leaves
    (and are the left siblings of whatever is appended next)."""
    keys, start = [], 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            keys.append((level, start >> level))
            start += 1 << level
    return keys


def read_nodes(
    tx: Transaction, keys: Iterable[NodeKey], table: str = "ledger_nodes"
) -> dict[NodeKey, bytes]:
    """Nodes of the log's tree (or of the map of stream heads: ``table``)."""
    wanted = sorted(set(keys))
    found: dict[NodeKey, bytes] = {}
    for chunk in range(0, len(wanted), 200):
        part = wanted[chunk : chunk + 200]
        where = " OR ".join(["(level = ? AND node_index = ?)"] * len(part))
        params = [value for key in part for value in key]
        for level, index, value in tx.execute(
            f"SELECT level, node_index, hash FROM {table} WHERE {where}", params
        ):
            found[(int(level), int(index))] = bytes(value)
    return found


def previous_hashes(
    tx: Transaction, backend: str, wanted: Iterable[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], bytes]:
    """The chain hashes of already sequenced events (stream, version): on
    PostgreSQL in one statement (a round trip each made the sequencer slower
    than the saves under load), on SQLite a lookup each, in process."""
    keys = sorted(set(wanted))
    if not keys:
        return {}
    if backend == "postgres":
        rows = tx.execute(
            "SELECT l.originator_id, l.originator_version, l.chain_hash FROM ledger_leaves l"
            " JOIN unnest(%b::uuid[], %b::bigint[]) AS w (stream, version)"
            " ON l.originator_id = w.stream AND l.originator_version = w.version",
            (_pack("u", [stream for stream, _ in keys]),
             _pack("i", [version for _, version in keys])),
        )
        return {(uuid.UUID(str(stream)), int(version)): bytes(value)
                for stream, version, value in rows}
    found: dict[tuple[uuid.UUID, int], bytes] = {}
    for stream, version in keys:
        rows = tx.execute(
            "SELECT chain_hash FROM ledger_leaves WHERE originator_id = ?"
            " AND originator_version = ?",
            (stream_key(backend, stream), version),
        )
        if rows:
            found[(stream, version)] = bytes(rows[0][0])
    return found


def append(
    tx: Transaction,
    backend: str,
    leaves: Sequence[tuple[int, int, uuid.UUID, int, bytes]],
    nodes: Sequence[tuple[int, int, bytes]],
) -> None:
    """Leaves (index, notification id, stream, version, chain hash) and nodes;
    on PostgreSQL one statement each (unnest of binary arrays), not a row each."""
    if backend == "postgres":
        if leaves:
            tx.execute(
                "INSERT INTO ledger_leaves (leaf_index, notification_id, originator_id,"
                " originator_version, chain_hash) SELECT * FROM"
                " unnest(%b::bigint[], %b::bigint[], %b::uuid[], %b::bigint[], %b::bytea[])",
                _packed(zip(*leaves, strict=True), "iiuib"),
            )
        if nodes:
            tx.execute(
                "INSERT INTO ledger_nodes (level, node_index, hash)"
                " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bytea[])",
                _packed(zip(*nodes, strict=True), "iib"),
            )
        return
    tx.executemany(
        "INSERT INTO ledger_leaves (leaf_index, notification_id, originator_id,"
        " originator_version, chain_hash) VALUES (?, ?, ?, ?, ?)",
        [(i, n, stream_key(backend, s), v, h) for i, n, s, v, h in leaves],
    )
    tx.executemany(
        "INSERT INTO ledger_nodes (level, node_index, hash) VALUES (?, ?, ?)", nodes
    )


def latest_checkpoint(tx: Transaction) -> tuple[int, str, float] | None:
    rows = tx.execute(
        "SELECT tree_size, note, signed_at FROM ledger_checkpoints"
        " ORDER BY tree_size DESC LIMIT 1"
    )
    return (int(rows[0][0]), str(rows[0][1]), float(rows[0][2])) if rows else None


def checkpoint_at(tx: Transaction, size: int) -> str | None:
    rows = tx.execute("SELECT note FROM ledger_checkpoints WHERE tree_size = ?", (size,))
    return str(rows[0][0]) if rows else None


def all_checkpoints(tx: Transaction) -> list[tuple[int, str]]:
    rows = tx.execute("SELECT tree_size, note FROM ledger_checkpoints ORDER BY tree_size")
    return [(int(size), str(note)) for size, note in rows]


def checkpoints_page(
    tx: Transaction, after: int, limit: int, newest: bool
) -> list[tuple[int, str, float]]:
    """Signed checkpoints (size, note, signed at) above size ``after``, by
    size: the first ``limit`` of them, or the last ``limit`` (``newest``)."""
    order = "DESC" if newest else "ASC"
    rows = tx.execute(
        "SELECT tree_size, note, signed_at FROM ledger_checkpoints WHERE tree_size > ?"
        f" ORDER BY tree_size {order} LIMIT ?",
        (after, limit),
    )
    found = [(int(size), str(note), float(at)) for size, note, at in rows]
    return sorted(found)


def replace_note(tx: Transaction, size: int, note: str, cosigned: str) -> None:
    """The checkpoint of ``size`` with its witnesses' cosignatures added."""
    tx.execute("UPDATE ledger_checkpoints SET note = ? WHERE tree_size = ? AND note = ?",
               (cosigned, size, note))


def add_checkpoint(tx: Transaction, size: int, note: str, signed_at: float) -> None:
    tx.execute(
        "INSERT INTO ledger_checkpoints (tree_size, note, signed_at) VALUES (?, ?, ?)",
        (size, note, signed_at),
    )


def stream_leaves(
    tx: Transaction, backend: str, stream_id: uuid.UUID
) -> dict[int, tuple[int, bytes]]:
    """A stream's sequenced events: version -> (leaf index, chain hash)."""
    rows = tx.execute(
        "SELECT originator_version, leaf_index, chain_hash FROM ledger_leaves"
        " WHERE originator_id = ?",
        (stream_key(backend, stream_id),),
    )
    return {int(v): (int(i), bytes(h)) for v, i, h in rows}


def leaves_page(
    tx: Transaction, after: int, limit: int
) -> list[tuple[int, int, Any, int, bytes]]:
    """Leaves after index ``after`` in order: (index, notification id, stream, version, hash)."""
    rows = tx.execute(
        "SELECT leaf_index, notification_id, originator_id, originator_version, chain_hash"
        " FROM ledger_leaves WHERE leaf_index > ? ORDER BY leaf_index LIMIT ?",
        (after, limit),
    )
    return [(int(i), int(n), s, int(v), bytes(h)) for i, n, s, v, h in rows]


def _position_column(backend: str) -> str:
    """The events table's notification id: SQLite's is the rowid."""
    return "notification_id" if backend == "postgres" else "rowid"


def fill_chain_column(tx: Transaction, backend: str, table: str) -> None:
    """Rows stored before the save wrote chain hashes get the sequencer's
    (the same hash: kandev_es_client.ledger.chain_hash over the same bytes)."""
    position = _position_column(backend)
    tx.execute(
        f"UPDATE {table} SET chain_hash = (SELECT l.chain_hash FROM ledger_leaves l"
        f" WHERE l.notification_id = {table}.{position}) WHERE chain_hash IS NULL"
    )


def stored_chain_hashes(tx: Transaction, backend: str, table: str) -> dict[int, bytes | None]:
    """Every event's stored chain hash by notification id (None: not written)."""
    position = _position_column(backend)
    rows = tx.execute(f"SELECT {position}, chain_hash FROM {table}")
    return {int(n): None if h is None else bytes(h) for n, h in rows}


def map_size(tx: Transaction, backend: str) -> int:
    """The log size the map of stream heads describes, its row locked until
    the transaction ends (PostgreSQL; SQLite's writers are serial)."""
    lock = " FOR UPDATE" if backend == "postgres" else ""
    rows = tx.execute(f"SELECT tree_size FROM ledger_map_state WHERE id = 1{lock}")
    return int(rows[0][0]) if rows else 0


def set_map_size(tx: Transaction, size: int) -> None:
    tx.execute("UPDATE ledger_map_state SET tree_size = ? WHERE id = 1", (size,))


def clear_map(tx: Transaction) -> None:
    tx.execute("DELETE FROM ledger_heads")
    tx.execute("DELETE FROM ledger_map_nodes")


def upsert_heads(
    tx: Transaction, backend: str, rows: Sequence[tuple[uuid.UUID, int, int, bytes]]
) -> None:
    """(stream, bucket, version, chain hash): each stream's head now; on
    PostgreSQL one statement (unnest of arrays), not a row each."""
    conflict = (" ON CONFLICT (originator_id) DO UPDATE SET originator_version ="
                " excluded.originator_version, chain_hash = excluded.chain_hash")
    if backend == "postgres":
        if rows:
            tx.execute(
                "INSERT INTO ledger_heads (originator_id, bucket, originator_version, chain_hash)"
                " SELECT * FROM unnest(%b::uuid[], %b::bigint[], %b::bigint[], %b::bytea[])"
                + conflict,
                _packed(zip(*rows, strict=True), "uiib"),
            )
        return
    tx.executemany(
        "INSERT INTO ledger_heads (originator_id, bucket, originator_version, chain_hash)"
        " VALUES (?, ?, ?, ?)" + conflict,
        [(stream_key(backend, s), b, v, h) for s, b, v, h in rows],
    )


def bucket_heads(
    tx: Transaction, backend: str, buckets: Iterable[int]
) -> dict[int, list[tuple[uuid.UUID, int, bytes]]]:
    """Every head in each of ``buckets``: bucket -> [(stream, version, hash)]."""
    wanted = sorted(set(buckets))
    found: dict[int, list[tuple[uuid.UUID, int, bytes]]] = {b: [] for b in wanted}
    select = "SELECT originator_id, bucket, originator_version, chain_hash FROM ledger_heads"
    if backend == "postgres":
        rows = tx.execute(select + " WHERE bucket = ANY(%b::bigint[])", (_pack("i", wanted),))
    else:
        rows = []
        for chunk in range(0, len(wanted), 500):
            part = wanted[chunk : chunk + 500]
            rows += tx.execute(select + f" WHERE bucket IN ({', '.join('?' * len(part))})", part)
    for stream, bucket, version, value in rows:
        found[int(bucket)].append((uuid.UUID(str(stream)), int(version), bytes(value)))
    return found


def read_map_nodes(
    tx: Transaction, backend: str, keys: Iterable[NodeKey]
) -> dict[NodeKey, bytes]:
    """Nodes of the map of stream heads; on PostgreSQL in one statement."""
    wanted = sorted(set(keys))
    if backend != "postgres":
        return read_nodes(tx, wanted, "ledger_map_nodes")
    if not wanted:
        return {}
    rows = tx.execute(
        "SELECT m.level, m.node_index, m.hash FROM ledger_map_nodes m"
        " JOIN unnest(%b::bigint[], %b::bigint[]) AS w (level, node_index)"
        " ON m.level = w.level AND m.node_index = w.node_index",
        (_pack("i", [level for level, _ in wanted]), _pack("i", [index for _, index in wanted])),
    )
    return {(int(level), int(index)): bytes(value) for level, index, value in rows}


def write_map_nodes(
    tx: Transaction, backend: str, nodes: Sequence[tuple[int, int, bytes]]
) -> None:
    conflict = " ON CONFLICT (level, node_index) DO UPDATE SET hash = excluded.hash"
    if backend == "postgres":
        if nodes:
            tx.execute(
                "INSERT INTO ledger_map_nodes (level, node_index, hash)"
                " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bytea[])" + conflict,
                _packed(zip(*nodes, strict=True), "iib"),
            )
        return
    tx.executemany(
        "INSERT INTO ledger_map_nodes (level, node_index, hash) VALUES (?, ?, ?)" + conflict,
        list(nodes),
    )


def stored_stream_ids(tx: Transaction, backend: str, table: str) -> dict[int, Any]:
    """Every event's stream id exactly as stored, by notification id: SQLite's
    TEXT as written (PostgreSQL's uuid column has one form only: nothing)."""
    if backend == "postgres":
        return {}
    rows = tx.execute(f"SELECT rowid, originator_id FROM {table}")
    return {int(n): s for n, s in rows}


def stream_id_guard_ddl(backend: str, table: str) -> tuple[str, ...]:
    """SQLite: the events table refuses a stream id that is not 32 lower-case
    hex digits, the form the application looks streams up by (PostgreSQL's
    uuid column has one form only)."""
    if backend == "postgres":
        return ()
    check = ("WHEN length(NEW.originator_id) <> 32"
             " OR NEW.originator_id GLOB '*[^0-9a-f]*'"
             " BEGIN SELECT RAISE(ABORT, 'kandev: a stream id is stored as 32 lower-case"
             " hex digits'); END")
    return (
        f"CREATE TRIGGER IF NOT EXISTS {table}_canonical_stream_id"
        f" BEFORE INSERT ON {table} {check}",
        f"CREATE TRIGGER IF NOT EXISTS {table}_canonical_stream_id_update"
        f" BEFORE UPDATE OF originator_id ON {table} {check}",
    )


def add_reanchor(tx: Transaction, backend: str, note: str, signed_at: float) -> None:
    """An operator's signed re-anchor statement (``audit reanchor``). Its
    table is made here too: the runbook re-anchors a restored store before
    ``db init`` (which refuses to sign until then), and a store restored from
    an earlier version has no such table yet."""
    ddl = [d for d in ledger_ddl(backend) if "ledger_reanchors" in d]
    for statement in ddl:
        tx.execute(statement)
    tx.execute("INSERT INTO ledger_reanchors (signed_at, note) VALUES (?, ?)", (signed_at, note))


def reanchors(tx: Transaction, backend: str) -> list[str]:
    """The re-anchor statements, oldest first (none in a store whose ``db
    init`` predates them: the table is not there yet)."""
    present = ("SELECT to_regclass('ledger_reanchors') IS NOT NULL" if backend == "postgres"
               else "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'ledger_reanchors'")
    if not tx.execute(present)[0][0]:
        return []
    rows = tx.execute("SELECT note FROM ledger_reanchors ORDER BY signed_at")
    return [str(note) for (note,) in rows]
