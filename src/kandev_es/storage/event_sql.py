"""The SQL our PostgreSQL recorder installs beside the library's table: the
one-statement save and the in-place upgrade of an older events table (docs/architecture.md:
Ordering without a global lock)."""

from __future__ import annotations

from kandev_es_client.ledger import CHAIN_TAG, GENESIS
from psycopg.sql import SQL, Composable, Composed, Literal


def upgrade_statement(table: Composable, table_sql: str) -> Composed:
    """Brings an events table of any earlier version to this one, keeping every
    row: adds ``transaction_id`` (existing rows get 0, new rows their own
    transaction's id) and makes ``notification_id``'s default take the
    transaction's id before it draws from the sequence (settled.py relies on
    that order), and makes the sequence hand out one id at a time (CACHE 1):
    with a per-session cache a session's next id can be below one another
    session has committed and a reader has passed, and settled.py relies on
    ids being drawn in time order. Checked against the catalog first, so a
    second ``db init`` takes no lock."""
    name = Literal(table_sql)
    return SQL(
        "DO $UPGRADE$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {name}::regclass"
        "  AND attname = 'transaction_id' AND NOT attisdropped) THEN"
        "  ALTER TABLE {table} ADD COLUMN transaction_id xid8 NOT NULL DEFAULT '0'::xid8;"
        "  ALTER TABLE {table} ALTER COLUMN transaction_id SET DEFAULT pg_current_xact_id();"
        " END IF;"
        " IF NOT EXISTS (SELECT 1 FROM pg_attrdef d JOIN pg_attribute a"
        "  ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
        "  WHERE d.adrelid = {name}::regclass AND a.attname = 'notification_id'"
        "  AND pg_get_expr(d.adbin, d.adrelid) LIKE '%pg_current_xact_id()%') THEN"
        "  EXECUTE format('ALTER TABLE %s ALTER COLUMN notification_id SET DEFAULT"
        "   CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval(%L::regclass) END',"
        "   {name}, pg_get_serial_sequence({name}, 'notification_id'));"
        " END IF;"
        " IF (SELECT seqcache FROM pg_sequence WHERE seqrelid ="
        "  pg_get_serial_sequence({name}, 'notification_id')::regclass) <> 1 THEN"
        "  EXECUTE format('ALTER SEQUENCE %s CACHE 1',"
        "   pg_get_serial_sequence({name}, 'notification_id'));"
        " END IF;"
        " END $UPGRADE$"
    ).format(name=name, table=table)


def drop_old_insert_function(function: Composable) -> Composed:
    """The ``kandev_insert_events`` of earlier versions (six arguments, then
    seven before the caller passed the chain hashes it knows): beside this
    one, whose last arguments have defaults, a call would be ambiguous."""
    return SQL(
        "DROP FUNCTION IF EXISTS {function}(uuid[], bigint[], text[], bytea[], uuid[], bigint[]);"
        " DROP FUNCTION IF EXISTS {function}(uuid[], bigint[], text[], bytea[], uuid[],"
        " bigint[], jsonb)"
    ).format(function=function)


def insert_function(function: Composable, table: Composable, apply_views: Composable) -> Composed:
    """``kandev_insert_events``: the streams' locks (sorted, so two saves never
    deadlock; exclusive for written streams, shared for guard streams), then
    the guard, then the insert, in one statement. No table lock: readers cope
    with ids committing out of order (settled.py). Only under READ COMMITTED:
    the guard must read with a snapshot taken after the locks are granted,
    and a REPEATABLE READ or SERIALIZABLE transaction's snapshot is older (it
    would pass a guard whose stream moved while it waited), so it refuses.
    Then, in the same transaction, the inline projections' rows (``views``,
    storage/view_writes.py) with the ids the insert drew, in insert order.
    ``hashes``: the chain hash of each event the caller could compute
    (storage/chains.py: its previous is the genesis or earlier in the save),
    NULL where the previous is a stored row, filled here under the stream's
    lock; no array: all computed here. ``chains`` false writes no hash
    (KANDEV_LEDGER_SAVE_CHAINS off)."""
    return SQL(
        "CREATE OR REPLACE FUNCTION {function}("
        "ids uuid[], versions bigint[], topics text[], states bytea[],"
        " guard_ids uuid[], guard_versions bigint[], views jsonb DEFAULT NULL,"
        " hashes bytea[] DEFAULT NULL, chains boolean DEFAULT true)"
        " RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$"
        " DECLARE key bigint; exclusive boolean; positions bigint[];"
        " previous bytea; found_here boolean := false;"
        " BEGIN"
        "  IF current_setting('transaction_isolation') <> 'read committed' THEN"
        "   RAISE EXCEPTION 'kandev_insert_events needs READ COMMITTED, not %',"
        "    current_setting('transaction_isolation') USING ERRCODE = 'feature_not_supported';"
        "  END IF;"
        "  FOR key, exclusive IN SELECT k, bool_or(x) FROM ("
        "    SELECT hashtextextended(i::text, 0) AS k, true AS x FROM unnest(ids) AS i"
        "    UNION ALL SELECT hashtextextended(g::text, 0), false"
        "    FROM unnest(guard_ids) AS g) AS streams GROUP BY k ORDER BY k LOOP"
        "   IF exclusive THEN PERFORM pg_advisory_xact_lock(key);"
        "   ELSE PERFORM pg_advisory_xact_lock_shared(key); END IF;"
        "  END LOOP;"
        "  FOR i IN 1 .. coalesce(array_length(guard_ids, 1), 0) LOOP"
        "   IF EXISTS (SELECT 1 FROM {table} WHERE originator_id = guard_ids[i]"
        "    AND originator_version > guard_versions[i]) THEN RETURN; END IF;"
        "  END LOOP;"
        "{chain_loop}"
        "  WITH inserted AS (INSERT INTO {table}"
        "   (originator_id, originator_version, topic, state, chain_hash)"
        "   SELECT * FROM unnest(ids, versions, topics, states, hashes)"
        "   RETURNING notification_id)"
        "  SELECT array_agg(notification_id ORDER BY notification_id) INTO positions"
        "   FROM inserted;"  # one statement draws its ids in row order
        "  IF views IS NOT NULL THEN PERFORM {apply_views}(views, positions); END IF;"
        "  RETURN QUERY SELECT unnest(positions);"
        " END $BODY$"
    ).format(
        function=function, table=table, apply_views=apply_views, chain_loop=_chain_loop(table),
    )


def _chain_loop(table: Composable) -> Composed:
    """The chain hashes the caller left NULL (kandev_es_client.ledger.chain_hash,
    the same bytes): its stream's previous hash is earlier in this save or the
    stream's stored row, which the stream's lock keeps still. An old row
    without a hash (before db init's backfill) leaves NULL. Skipped whole when
    the caller knew every hash (a Created's save)."""
    return SQL(
        "  IF NOT chains THEN hashes := NULL;"
        "  ELSIF hashes IS NULL THEN"
        "   hashes := array_fill(NULL::bytea, ARRAY[array_length(ids, 1)]);"
        "  END IF;"
        "  IF array_position(hashes, NULL) IS NOT NULL THEN"
        "  FOR i IN 1 .. array_length(ids, 1) LOOP"
        "   CONTINUE WHEN hashes[i] IS NOT NULL;"
        "   previous := NULL;"
        "   IF versions[i] = 1 THEN previous := {genesis};"
        "   ELSE"
        "    FOR j IN REVERSE i - 1 .. 1 LOOP"
        "     IF ids[j] = ids[i] AND versions[j] = versions[i] - 1 THEN"
        "      previous := hashes[j]; found_here := true; EXIT; END IF;"
        "    END LOOP;"
        "    IF NOT found_here THEN SELECT chain_hash INTO previous FROM {table}"
        "     WHERE originator_id = ids[i] AND originator_version = versions[i] - 1; END IF;"
        "   END IF;"
        "   found_here := false;"
        "   hashes[i] := sha256({tag} || uuid_send(ids[i]) || int8send(versions[i]) || previous"
        "    || int4send(octet_length(convert_to(topics[i], 'UTF8')))"
        "    || convert_to(topics[i], 'UTF8') || states[i]);"
        "  END LOOP;"
        "  END IF;"
    ).format(table=table, tag=Literal(CHAIN_TAG), genesis=Literal(GENESIS))


def chain_column_statement(table: Composable, table_sql: str) -> Composed:
    """Adds the events' ``chain_hash`` column (docs/auditing.md), checked
    against the catalog first so a second ``db init`` takes no lock. Rows
    stored before it are filled by db init's backfill (services/ledger.py)."""
    return SQL(
        "DO $CHAIN$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {name}::regclass"
        "  AND attname = 'chain_hash' AND NOT attisdropped) THEN"
        "  ALTER TABLE {table} ADD COLUMN chain_hash bytea;"
        " END IF;"
        " END $CHAIN$"
    ).format(name=Literal(table_sql), table=table)
