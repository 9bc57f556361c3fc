"""``audit verify --ledger`` against the attacks it missed (issue 43 point 2),
on both backends (SQLite in the file, PostgreSQL by SQL as the tables' owner):
two events of different streams whose stored positions were swapped (leaves
re-pointed, tree untouched), an event stored under an upper-cased stream id
(the same UUID to a parser, another stream to the application's exact lookup),
and a failure message that named an empty range of leaves and no event."""

from __future__ import annotations

import re
import sqlite3

import pytest
from kandev_es_client import merkle
from kandev_es_client.signed_note import Checkpoint, sign_note

from kandev_es.domain.external_id import identity_id
from kandev_es.services import ledger
from kandev_es.services.ledger_audit import verify_ledger
from kandev_es.storage.ledger import stream_key
from tests.integration.tampering import TAMPERING, in_the_store, swap_positions, upper_case
from tests.integration.test_ledger import keyring, logged

EVENT = re.compile(r"stream [0-9a-f-]{36} version \d+")


def names_an_event(problem) -> bool:
    return problem.stream is not None or EVENT.search(problem.problem) is not None


def test_swapped_positions_of_two_streams_are_found_and_both_events_named(
    services, workspace, member
):
    logged(services, workspace, member, "S-1", "S-2")
    kept = logged(services, workspace, member, "S-3")
    first, second = identity_id(workspace.id, "S-1"), identity_id(workspace.id, "S-2")
    _, b = swap_positions(services, first, second)
    order = [n.originator_id for n in services.app.recorder.select_notifications(
        start=0, limit=10_000, inclusive_of_start=False) if n.originator_id in (first, second)]
    assert order[0] == second  # readers now see the second stream's event first

    report = verify_ledger(services.app, services.database, keyring(services), kept)
    lines = [p.line() for p in report.problems]
    assert not report.ok, "the swap passed"
    assert {(p.stream, p.version) for p in report.problems} == {(str(first), 1),
                                                                (str(second), 1)}, lines
    assert all("the store's order is not the log's" in line for line in lines), lines
    assert f"stored at position {b}" in lines[0] or f"stored at position {b}" in lines[1]


def test_an_upper_cased_stream_id_is_refused_by_the_store_and_named_by_the_audit(
    services, workspace, member, backend
):
    kept = logged(services, workspace, member, "U-1")
    stream = identity_id(workspace.id, "U-1")
    history = list(services.app.recorder.select_events(stream))
    last = history[-1].originator_version
    table = services.app.recorder.events_table_name
    if backend == "sqlite":
        refused = pytest.raises(sqlite3.IntegrityError, match="32 lower-case hex digits")
        with refused, in_the_store(services) as sql:
            sql.execute(f"UPDATE {table} SET originator_id = upper(originator_id)"
                        " WHERE originator_version = 1")
        refused = pytest.raises(sqlite3.IntegrityError, match="32 lower-case hex digits")
        with refused, in_the_store(services) as sql:
            sql.execute(f"INSERT INTO {table} (originator_id, originator_version, topic,"
                        " state) VALUES (?, 1, 'x', x'00')", (stream.hex.upper(),))

    upper_case(services, stream, last)
    now = list(services.app.recorder.select_events(stream))
    report = verify_ledger(services.app, services.database, keyring(services), kept)
    lines = [p.line() for p in report.problems]
    if backend == "postgres":  # one spelling of a uuid: nothing was hidden
        assert len(now) == len(history) and report.ok, lines
        return
    assert len(now) == len(history) - 1  # the application lost the identity's last event
    assert not report.ok, "the hidden event passed"
    assert [(p.stream, p.version) for p in report.problems] == [(str(stream), last)], lines
    assert f"stored under the stream id '{stream.hex.upper()}'" in lines[0]


def test_a_checkpoint_failure_names_the_first_event_never_an_empty_range(
    services, workspace, member
):
    """The store's checkpoint of the auditor's size re-signed over a rewritten
    log (what the signer did before the anchor): the auditor's checkpoint of
    the same size fails, naming an event ("leaves 24..23" and no event before)."""
    logged(services, workspace, member, "M-1")
    kept = logged(services, workspace, member, "M-2")
    size = keyring(services).open_checkpoint(kept).size
    TAMPERING["rewrite"](services, identity_id(workspace.id, "M-2"))
    with in_the_store(services) as sql:
        tree = merkle.MemoryTree()
        for (value,) in sql.execute("SELECT chain_hash FROM ledger_leaves"
                                    " WHERE leaf_index < ? ORDER BY leaf_index", (size,)):
            tree.append(bytes(value))
        signer = ledger.load_signer(services.settings)
        extensions = tuple(kept.split("\n\n")[0].split("\n")[3:])
        forged = sign_note(Checkpoint(signer.name, size, tree.root(), extensions).text(), signer)
        sql.execute("UPDATE ledger_checkpoints SET note = ? WHERE tree_size = ?", (forged, size))

    report = verify_ledger(services.app, services.database, keyring(services), kept)
    # (The map of stream heads it commits to fails too: only its root is
    # signed, so that line can say which checkpoint, not which stream.)
    given = [p for p in report.problems if p.problem.startswith("the given checkpoint")
             and "map of stream heads" not in p.problem]
    assert len(given) == 1, [p.line() for p in report.problems]
    assert names_an_event(given[0]), given[0].line()
    for low, high in re.findall(r"leaves (\d+) to (\d+)", given[0].problem):
        assert int(low) <= int(high), given[0].line()


@pytest.mark.parametrize("tamper", ["edit", "delete", "swap", "cut", "drop_stream"])
def test_every_failure_of_the_known_attacks_names_an_event(
    services, workspace, member, tamper
):
    logged(services, workspace, member, "N-1")
    kept = logged(services, workspace, member, "N-2")
    TAMPERING[tamper](services, identity_id(workspace.id, "N-2"))
    report = verify_ledger(services.app, services.database, keyring(services), kept)
    assert not report.ok
    unnamed = [p.line() for p in report.problems if not names_an_event(p)]
    assert not unnamed, unnamed


def test_a_stream_id_that_is_no_uuid_is_refused_or_named_not_a_crash(
    services, workspace, member, backend
):
    kept = logged(services, workspace, member, "G-1")
    table = services.app.recorder.events_table_name
    key = stream_key(backend, identity_id(workspace.id, "G-1"))
    with in_the_store(services) as sql:
        if backend == "postgres":  # the uuid column refuses it by type
            with pytest.raises(Exception, match="uuid"):
                sql.execute(f"UPDATE {table} SET originator_id = 'not-a-stream'"
                            " WHERE originator_id = ?", (key,))
            return
        sql.execute(f"DROP TRIGGER {table}_canonical_stream_id_update")
        sql.execute(f"UPDATE {table} SET originator_id = 'not-a-stream' WHERE originator_id = ?"
                    " AND originator_version = 2", (key,))
    report = verify_ledger(services.app, services.database, keyring(services), kept)
    lines = [p.line() for p in report.problems]
    assert len(lines) == 1 and "stored under 'not-a-stream', which is not a stream id" in lines[0]
