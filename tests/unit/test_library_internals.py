"""Canaries for the library internals kandev-es relies on.

psycopg_pool has no public option for handing out connections LIFO or for a
constant reconnection delay, and eventsourcing has no public hook around its
insert or its retry decorator, so storage/pools.py, storage/reconnect.py and
storage/recorders.py use these names; api/tasks.py keeps flask-smorest's
``_apidoc`` and api/answers.py and creation/request.py read marshmallow's
``Schema._hooks``. setup.cfg bounds each of these libraries above; when an
upgrade renames one of the names, these tests say which and where it is used.

Each canary runs on every install its library is on: only the ones about
psycopg and eventsourcing's PostgreSQL module skip without the postgres extra
(a test below runs this module with psycopg hidden to hold that)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.sqlite import SQLiteApplicationRecorder

try:
    from eventsourcing import postgres
    from psycopg_pool import ConnectionPool
except ImportError:  # the SQLite-only install: no postgres extra
    postgres = None

needs_psycopg = pytest.mark.skipif(
    postgres is None, reason="psycopg internals: only with the postgres extra"
)


def _changed(library: str, name: str, user: str) -> str:
    return (f"{library} no longer has {name}, which {user} relies on: "
            f"rework {user} before raising the version bound in setup.cfg")


@needs_psycopg
def test_pool_picks_ready_connections_in_one_overridable_method() -> None:
    method = getattr(ConnectionPool, "_get_ready_connection", None)
    assert method is not None, _changed(
        "psycopg_pool", "ConnectionPool._get_ready_connection", "storage/pools.py")
    assert list(inspect.signature(method).parameters) == ["self", "timeout"], _changed(
        "psycopg_pool", "_get_ready_connection(self, timeout)", "storage/pools.py")


@needs_psycopg
def test_pool_keeps_idle_connections_in_a_deque_with_a_low_water_mark() -> None:
    pool: ConnectionPool[Any] = ConnectionPool("", open=False)
    assert isinstance(getattr(pool, "_pool", None), deque), _changed(
        "psycopg_pool", "ConnectionPool._pool (a deque)", "storage/pools.py")
    assert isinstance(getattr(pool, "_nconns_min", None), int), _changed(
        "psycopg_pool", "ConnectionPool._nconns_min", "storage/pools.py")


@needs_psycopg
def test_pool_reads_its_backoff_from_class_attributes() -> None:
    base = pytest.importorskip("psycopg_pool.base")
    attempt = getattr(base, "AttemptWithBackoff", None)
    assert attempt is not None, _changed(
        "psycopg_pool.base", "AttemptWithBackoff", "storage/reconnect.py")
    for name in ("INITIAL_DELAY", "DELAY_BACKOFF"):
        assert isinstance(getattr(attempt, name, None), float), _changed(
            "psycopg_pool", f"AttemptWithBackoff.{name}", "storage/reconnect.py")


@needs_psycopg
@pytest.mark.parametrize("owner, name", [
    ("PostgresAggregateRecorder", "select_events"),
    ("PostgresApplicationRecorder", "select_notifications"),
    ("PostgresApplicationRecorder", "max_notification_id"),
])
def test_recorder_retry_decorator_exposes_the_undecorated_method(owner: str,
                                                                 name: str) -> None:
    method = getattr(getattr(postgres, owner), name)
    wrapped = getattr(method, "__wrapped__", None)
    assert callable(wrapped) and wrapped.__name__ == name, _changed(
        "eventsourcing", f"{owner}.{name}.__wrapped__", "storage/recorders.py")


def test_sqlite_recorder_inserts_through_one_overridable_method() -> None:
    method = getattr(SQLiteApplicationRecorder, "_insert_events", None)
    assert method is not None, _changed(
        "eventsourcing", "SQLiteApplicationRecorder._insert_events", "storage/sqlite_recorder.py")
    parameters = inspect.signature(method).parameters
    assert list(parameters)[:3] == ["self", "c", "stored_events"], _changed(
        "eventsourcing", "_insert_events(self, c, stored_events, **kwargs)",
        "storage/sqlite_recorder.py")
    assert any(p.kind is p.VAR_KEYWORD for p in parameters.values()), _changed(
        "eventsourcing", "_insert_events(..., **kwargs)", "storage/sqlite_recorder.py")


def test_sqlite_pool_hands_out_writers_through_overridable_methods(tmp_path: Any) -> None:
    from eventsourcing.sqlite import SQLiteConnectionPool, SQLiteDatastore

    user = "storage/sqlite_factory.py"
    get = inspect.signature(SQLiteConnectionPool.get_connection).parameters
    assert "timeout" in get and "is_writer" in get, _changed(
        "eventsourcing", "SQLiteConnectionPool.get_connection(timeout, *, is_writer)", user)
    assert list(inspect.signature(SQLiteConnectionPool.put_connection).parameters) == [
        "self", "conn"], _changed("eventsourcing", "SQLiteConnectionPool.put_connection", user)
    datastore = SQLiteDatastore(db_name=str(tmp_path / "canary.sqlite3"))
    for name in ("pool", "single_row_tracking", "originator_id_type"):
        assert hasattr(datastore, name), _changed("eventsourcing", f"SQLiteDatastore.{name}", user)
    assert hasattr(datastore.pool, "db_name"), _changed(
        "eventsourcing", "SQLiteConnectionPool.db_name", user)
    conn = datastore.pool.get_connection(is_writer=True)
    try:
        assert getattr(conn, "is_writer", None) is True, _changed(
            "eventsourcing", "SQLiteConnection.is_writer", user)
    finally:
        datastore.pool.put_connection(conn)
        datastore.pool.close()


def test_sqlite_connections_begin_through_the_transaction_sqlite_factory_replaces(
    tmp_path: Any,
) -> None:
    """storage/sqlite_factory.py turns the pool's connections into ones whose
    writer transactions BEGIN IMMEDIATE: it needs the pool to make them in
    ``_create_connection`` and the transaction to open with a plain BEGIN in
    ``__enter__`` from its ``connection`` and ``commit``."""
    from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteTransaction

    user = "storage/sqlite_factory.py"
    assert "_create_connection" in vars(SQLiteConnectionPool), _changed(
        "eventsourcing", "SQLiteConnectionPool._create_connection", user)
    enter = inspect.getsource(SQLiteTransaction.__enter__)
    assert 'execute("BEGIN")' in enter and "self.connection.cursor()" in enter, _changed(
        "eventsourcing", "SQLiteTransaction.__enter__ (a plain BEGIN)", user)
    transaction = inspect.getsource(SQLiteConnection.transaction)
    assert "SQLiteTransaction(self, commit=commit)" in transaction, _changed(
        "eventsourcing", "SQLiteConnection.transaction", user)
    pool = SQLiteConnectionPool(db_name=str(tmp_path / "canary.sqlite3"))
    try:
        conn = pool._create_connection()
        assert type(conn) is SQLiteConnection, _changed(
            "eventsourcing", "SQLiteConnectionPool._create_connection's class", user)
        conn.close()
    finally:
        pool.close()


@needs_psycopg
@pytest.mark.parametrize("owner, method, attribute", [
    # recorders.py replaces the statement with named columns; renamed, the
    # library would silently go back to its own SELECT *.
    ("PostgresAggregateRecorder", "select_events", "self.select_events_statement"),
    # recorders.py appends its upgrade and insert function to these.
    ("PostgresAggregateRecorder", "create_table", "self.sql_create_statements"),
])
def test_postgres_recorder_reads_the_statements_recorders_py_replaces(owner: str, method: str,
                                                                       attribute: str) -> None:
    function = getattr(getattr(postgres, owner), method)
    source = inspect.getsource(inspect.unwrap(function))
    assert attribute in source, _changed(
        "eventsourcing", f"{owner}.{method} reading {attribute}", "storage/recorders.py")


@needs_psycopg
def test_a_live_event_store_pool_can_switch_to_most_recent_first() -> None:
    """storage/pools.py swaps the class of the pool eventsourcing built: the
    subclass must keep its layout (no __slots__ added upstream), and the
    override must see the idle deque."""
    from kandev_es.storage.pools import serve_most_recent_first

    pool = postgres.ConnectionPool("", open=False)
    base = type(pool)
    try:
        serve_most_recent_first(pool)
    except TypeError as error:  # "object layout differs"
        raise AssertionError(_changed(
            "eventsourcing/psycopg_pool", f"a __class__-swappable {base.__name__}",
            "storage/pools.py")) from error
    assert isinstance(pool, base) and type(pool) is not base
    pool._pool.extend(["older", "newer"])
    assert pool._get_ready_connection(1.0) == "newer"


def test_the_library_save_does_only_what_tasks_write_does() -> None:
    """application.py's Tasks._write replaces eventsourcing's Application.save
    (collect the pending events, map them, one insert_events call, then the
    snapshot and notify hooks, which Tasks leaves as the library's no-ops).
    Should the library's save come to do anything more, these names change."""
    from eventsourcing.application import Application, ProcessingEvent
    from eventsourcing.persistence import EventStore

    user = "application.py (Tasks._write)"
    expected = {
        Application.save: ("ProcessingEvent", "collect_events", "_record", "_take_snapshots",
                           "_notify", "notify", "events"),
        Application._record: ("events", "put", "tracking", "saved_kwargs", "repository",
                              "cache", "fastforward", "aggregates", "items"),
        Application._take_snapshots: None,  # only that it reads these first:
        EventStore.put: ("list", "map", "mapper", "to_stored_event", "recorder",
                         "insert_events", "len", "zip", "append", "Recording", "Notification",
                         "originator_id", "originator_version", "topic", "state"),
        ProcessingEvent.collect_events: ("isinstance", "DomainEventProtocol", "events", "append",
                                         "CollectEventsProtocol", "collect_events",
                                         "aggregates", "id", "saved_kwargs", "update"),
    }
    for function, names in expected.items():
        actual = function.__code__.co_names
        if names is None:
            assert actual[:2] == ("snapshots", "snapshotting_intervals"), _changed(
                "eventsourcing", f"{function.__qualname__} guarded by snapshots", user)
        else:
            assert actual == names, _changed(
                "eventsourcing", f"{function.__qualname__} as it was", user)
    def documented_no_op(self: Any, _: Any) -> None:
        """Does nothing."""

    for hook in (Application._notify, Application.notify):
        assert hook.__code__.co_code == documented_no_op.__code__.co_code, _changed(
            "eventsourcing", f"a no-op {hook.__qualname__}", user)


@needs_psycopg
def test_recorders_map_psycopg_errors_as_the_librarys_get_connection_does() -> None:
    """storage/recorders.py gets its pooled connections without the library's
    datastore.get_connection and maps psycopg's errors itself (an
    IntegrityError must stay the library's, for VersionConflict)."""
    import re

    import psycopg
    from eventsourcing import persistence

    from kandev_es.storage.recorders import LIBRARY_ERRORS

    source = inspect.getsource(inspect.unwrap(postgres.PostgresDatastore.get_connection))
    pairs = re.findall(r"except psycopg\.(\w+) as e:\s+(?:#[^\n]*\s+)*raise (\w+)\(", source)
    library = tuple((getattr(psycopg, a), getattr(persistence, b)) for a, b in pairs)
    assert library == LIBRARY_ERRORS, _changed(
        "eventsourcing", "PostgresDatastore.get_connection's error mapping", "storage/recorders.py")


def test_flask_smorest_documents_from_apidoc_and_passes_a_response_through() -> None:
    """api/tasks.py serves the create view without flask-smorest's wrappers,
    keeping only the documentation they collected in ``_apidoc``: right only
    while smorest reads a view's documentation from there and its wrappers
    hand a view's Response back unchanged."""
    from flask import Flask, Response
    from flask_smorest import Blueprint
    from marshmallow import Schema

    user = "api/tasks.py (_documentation_only)"
    source = inspect.getsource(Blueprint._store_endpoint_docs)
    assert 'getattr(function, "_apidoc"' in source, _changed(
        "flask_smorest", "Blueprint._store_endpoint_docs reading _apidoc", user)
    blp = Blueprint("canary", __name__)
    answer = Response(b"{}", status=201, mimetype="application/json")

    @blp.doc(summary="canary")
    @blp.response(200, Schema)
    @blp.alt_response(404, schema=Schema, description="not found")
    def view() -> Response:
        return answer

    assert {"manual_doc", "response", "success_status_codes"} <= set(view._apidoc), _changed(
        "flask_smorest", "decorators collecting _apidoc", user)
    with Flask("canary").test_request_context():
        served = view()
    assert served is answer and served.status_code == 201, _changed(
        "flask_smorest", "a view's Response returned as is", user)


def test_marshmallow_lists_a_schemas_hooks_in_hooks_empty_when_it_has_none() -> None:
    """api/answers.py and creation/request.py load and dump a create without
    marshmallow only for a schema with no hook at all, which they tell by
    every list of ``Schema._hooks`` being empty; a field's own processors are
    its ``pre_load``/``post_load`` lists (marshmallow 4.3)."""
    from marshmallow import (
        Schema,
        fields,
        post_dump,
        post_load,
        pre_dump,
        pre_load,
        validates,
        validates_schema,
    )

    from kandev_es.creation.outcomes import CreateTaskResponseSchema
    from kandev_es.creation.request import CreateTaskRequestSchema

    users = "api/answers.py (_plain_kinds), creation/request.py (_plain_rules)"

    class Plain(Schema):
        name = fields.String()

    for schema in (Plain(), CreateTaskRequestSchema(), CreateTaskResponseSchema()):
        hooks = getattr(schema, "_hooks", None)
        assert isinstance(hooks, dict) and not any(hooks.values()), _changed(
            "marshmallow", "Schema._hooks (empty lists without hooks)", users)

    def hooked(decorator: Any) -> Schema:
        class Hooked(Schema):
            name = fields.String()

            @decorator
            def hook(self, data: Any, **kwargs: Any) -> Any:
                return data

        return Hooked()

    for decorator in (pre_load, post_load, pre_dump, post_dump, validates_schema,
                      validates("name")):
        assert any(hooked(decorator)._hooks.values()), _changed(
            "marshmallow", f"Schema._hooks listing a {decorator!r} hook", users)

    field = fields.String(pre_load=[str.strip])
    assert list(field.pre_load) == [str.strip] and list(fields.String().post_load) == [], _changed(
        "marshmallow", "Field.pre_load/post_load", "creation/request.py (_plain)")


@pytest.mark.timeout(420)  # the inner pytest run has its own 300 s timeout
def test_the_canaries_that_need_no_postgresql_run_without_psycopg() -> None:
    """With psycopg hidden (a SQLite-only install) this module still runs every
    canary but the PostgreSQL ones: none is skipped for want of psycopg."""
    root = Path(__file__).resolve().parents[2]
    program = (
        "import sys; sys.modules.update(psycopg=None, psycopg_pool=None)\n"
        "import pytest\n"
        f"raise SystemExit(pytest.main([{__file__!r}, '-q', '-p', 'no:xdist', '-p',"
        " 'no:cacheprovider', '-k', 'not without_psycopg', '-rA']))\n"
    )
    # Any URL: conftest then starts no cluster, and no canary connects.
    env = os.environ | {"KANDEV_TEST_DATABASE_URL": "postgresql://unused/none"}
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=root, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    passed = {line.split("::")[1].split("[")[0] for line in run.stdout.splitlines()
              if line.startswith("PASSED ")}
    expected = {
        name for name, test in globals().items()
        if name.startswith("test_") and name != "test_the_canaries_that_need_no_postgresql_run"
        "_without_psycopg" and needs_psycopg.mark not in getattr(test, "pytestmark", [])
    }
    assert len(expected) >= 5 and passed == expected, run.stdout
    assert "SKIPPED" in run.stdout  # the PostgreSQL ones: psycopg was hidden


@needs_psycopg
def test_event_store_pool_is_built_closed_and_connects_with_its_conninfo_and_kwargs() -> None:
    """storage/recorders.KandevPostgresFactory swaps the library pool's
    conninfo and kwargs after the factory built it: that only works while the
    pool is still closed and its _connect reads those two attributes."""
    factory = postgres.PostgresFactory({
        "POSTGRES_DBNAME": "db", "POSTGRES_HOST": "h", "POSTGRES_PORT": "1",
        "POSTGRES_USER": "u", "POSTGRES_PASSWORD": "",
    })
    pool = factory.datastore.pool
    assert callable(getattr(pool, "drain", None)), _changed(
        "psycopg_pool", "ConnectionPool.drain()", "storage/recorders.py, storage/database.py")
    assert pool.closed, _changed(
        "eventsourcing", "PostgresDatastore's pool built closed (open=False)",
        "storage/recorders.py")
    # What the factory does: the pool then connects where conninfo says (a
    # refused port on loopback), not to the host "h" it was built with.
    pool.conninfo = "host=127.0.0.1 port=1 connect_timeout=2"
    pool.kwargs = {}
    import psycopg

    with pytest.raises(psycopg.OperationalError) as refused:
        pool._connect()
    assert "127.0.0.1" in str(refused.value) and '"h"' not in str(refused.value), _changed(
        "psycopg_pool", "ConnectionPool._connect reading .conninfo and .kwargs",
        "storage/recorders.py")


def test_uvicorn_h11_protocol_has_what_the_mcp_front_overrides() -> None:
    """mcp_http.FrontProtocol replaces the h11 connection, answers protocol
    errors in send_400_response, lets a cycle's app go and reads its timers."""
    import h11
    from uvicorn.protocols.http import h11_impl

    protocol = h11_impl.H11Protocol
    for name in ("send_400_response", "handle_events", "data_received", "connection_made",
                 "connection_lost", "shutdown", "on_response_complete",
                 "timeout_keep_alive_handler", "_unset_keepalive_if_required"):
        assert callable(getattr(protocol, name, None)), _changed(
            "uvicorn", f"H11Protocol.{name}", "mcp_http.py")
    assert list(inspect.signature(protocol.send_400_response).parameters) == ["self", "msg"], (
        _changed("uvicorn", "H11Protocol.send_400_response(self, msg)", "mcp_http.py"))
    source = inspect.getsource(protocol)
    for used in ("self.conn.next_event()", "except h11.RemoteProtocolError",
                 "self.send_400_response(", "self.cycle", "self.flow", "self.tasks"):
        assert used in source, _changed("uvicorn", f"H11Protocol's {used}", "mcp_http.py")
    cycle = inspect.getsource(h11_impl.RequestResponseCycle)
    for used in ("self.disconnected", "self.message_event", "self.response_complete"):
        assert used in cycle, _changed("uvicorn", f"RequestResponseCycle's {used}", "mcp_http.py")
    assert isinstance(h11_impl.STATUS_PHRASES.get(414), bytes)
    assert h11.RemoteProtocolError("x", error_status_hint=431).error_status_hint == 431
