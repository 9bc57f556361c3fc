"""The signer's anchor (docs/auditing.md, "The signer's anchor"): the
sequencer keeps the last checkpoint it signed beside the key and never signs a
log that does not extend it. The issue's attack — an event edited, every
chain hash set to NULL, the ledger's tables emptied, then a restart or ``db
init`` — signed the forged history with the real key before; now nothing is
signed, the refusal is an ERROR line, a metric and a degraded /readyz, and only
an operator's ``audit reanchor`` (a signed statement naming both roots) lets
signing go on after a real restore. Both backends: SQLite edited in its file,
PostgreSQL by SQL as the tables' owner."""

from __future__ import annotations

import dataclasses
import logging
import re
import sqlite3
import time
from contextlib import closing

import pytest
from kandev_es_client.signed_note import open_note, parse_checkpoint, split_note

from kandev_es import metrics
from kandev_es.domain.external_id import identity_id
from kandev_es.errors import LedgerRefused
from kandev_es.services import ledger, ledger_keys
from kandev_es.services.ledger_audit import verify_ledger
from tests.integration.tampering import in_the_store, unlog
from tests.integration.test_ledger import keyring, logged, services_client


def checkpoints(services) -> list[int]:
    with services.database.transaction() as tx:
        return [size for size, _ in ledger.store.all_checkpoints(tx)]


def restarted(services, **changes) -> ledger.Sequencer:
    """The sequencer of a process started after the tampering."""
    settings = dataclasses.replace(services.settings, **changes)
    return ledger.Sequencer(services.app, services.database, settings)


def refused_to_sign(services, match: str = "") -> None:
    """A restarted sequencer's catch-up refuses (LedgerRefused matching
    ``match``), tried until it does: on a shared PostgreSQL the events just
    stored may settle a moment later (another database's open transaction),
    and a pass that sees nothing new has nothing to refuse yet."""
    deadline = time.monotonic() + 20
    while True:
        try:
            restarted(services).catch_up()
        except LedgerRefused as error:
            assert re.search(match, error.message), error.message
            return
        assert time.monotonic() < deadline, "the sequencer signed instead of refusing"
        time.sleep(0.05)


def refused_gauge() -> float:
    return metrics.instruments().registry.get_sample_value("kandev_ledger_signing_refused") or 0


@pytest.mark.parametrize("cut", [False, True], ids=["edit", "cut"])
def test_a_rewritten_and_unlogged_history_is_never_signed(services, workspace, member, cli, cut):
    kept = logged(services, workspace, member, "A-1", "A-2")
    files = ledger_keys.key_files(services.settings)
    assert ledger_keys.read_anchor(files) == keyring(services).open_checkpoint(kept)
    assert files.anchor.stat().st_mode & 0o777 == 0o600
    unlog(services, identity_id(workspace.id, "A-2"), cut=cut)

    refused_to_sign(services, r"not a consistent extension|fewer than")
    assert checkpoints(services) == []
    init = cli("db", "init")
    assert init.exit_code == 1, init.output
    assert "REFUSED to sign a checkpoint" in init.output
    assert "kandev-es audit reanchor" in init.output
    assert checkpoints(services) == []
    assert cli("audit", "checkpoint", "--now").exit_code == 1
    assert checkpoints(services) == []
    # The anchor is untouched: what the host signed last is still what it signed.
    assert ledger_keys.read_anchor(files) == keyring(services).open_checkpoint(kept)


def test_the_serving_sequencer_refuses_loudly_counts_it_and_readyz_is_degraded(
    services, workspace, member, caplog, monkeypatch
):
    monkeypatch.setattr(ledger, "HEALTH_SECONDS", 0.0)  # /readyz looks again at each call
    logged(services, workspace, member, "B-1")
    client = services_client(services)
    assert client.get("/readyz").json["status"] == "ready"
    unlog(services, identity_id(workspace.id, "B-1"))
    sequencer = restarted(services, ledger_checkpoint_events=1)
    refusals = (
        metrics.instruments().registry.get_sample_value("kandev_ledger_signing_refusals_total") or 0
    )
    with caplog.at_level(logging.ERROR, logger="kandev_es.ledger"):
        thread = sequencer.start_thread()
        deadline = time.monotonic() + 20
        while sequencer.refused is None:
            assert time.monotonic() < deadline, "the sequencer did not refuse"
            time.sleep(0.05)
        assert refused_gauge() == 1
        sequencer.stop()
        thread.join(10)
    assert any(
        "REFUSED to sign a checkpoint" in r.getMessage() and r.levelno == logging.ERROR
        for r in caplog.records
    )
    assert (
        metrics.instruments().registry.get_sample_value("kandev_ledger_signing_refusals_total")
        > refusals
    )
    assert checkpoints(services) == []
    ready = client.get("/readyz")  # this process's own look (its sequencer is not running)
    assert ready.status_code == 200
    assert ready.json["status"] == "degraded"
    assert "fewer than the last checkpoint this host signed" in ready.json["ledger_refused"]


def back_up(services):
    """A backup of the whole store: SQLite's online backup of the file, on
    PostgreSQL a copy of every table of the store's schema beside it."""
    if services.database.backend == "sqlite":
        copy = sqlite3.connect(":memory:")
        with closing(sqlite3.connect(services.settings.sqlite_path)) as live:
            live.backup(copy)
        return copy
    with services.database.transaction() as tx:
        tables = [
            str(t)
            for (t,) in tx.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
        for table in tables:
            tx.execute(f"CREATE TABLE backup_{table} AS SELECT * FROM {table}")
    return tables


def restore(services, backup) -> None:
    """Restore ``backup`` over the live store, as an operator would."""
    if services.database.backend == "sqlite":
        with closing(sqlite3.connect(services.settings.sqlite_path, timeout=10)) as live:
            backup.backup(live)
        return
    with services.database.transaction() as tx:
        tx.execute("TRUNCATE " + ", ".join(backup))
        for table in backup:
            tx.execute(f"INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT * FROM backup_{table}")


def test_after_a_real_restore_an_operator_reanchors_with_a_signed_statement(
    services, workspace, member, cli, tmp_path
):
    logged(services, workspace, member, "R-1")
    backup = back_up(services)
    lost = logged(services, workspace, member, "R-2")  # an auditor kept this one
    untouched = cli("audit", "reanchor", "--reason", "not restored yet")
    assert untouched.exit_code == 0 and "nothing to re-anchor" in untouched.stderr
    assert untouched.stdout == ""
    assert not ledger_keys.key_files(services.settings).reanchors.exists()
    restore(services, backup)
    with in_the_store(services) as sql:  # restored from a version without the table
        sql.execute("DROP TABLE ledger_reanchors")
    assert verify_ledger(services.app, services.database, keyring(services)).reanchors == []
    assert create_more(services, workspace, member, "R-3")  # after the restore: a fork
    refused_to_sign(services)

    done = cli("audit", "reanchor", "--reason", "INC-42 restore of the 02:00 backup")
    assert done.exit_code == 0, done.output
    statement = done.stdout
    text, _ = open_note(statement, [ring.verifier for ring in keyring(services).entries])
    lines = text.splitlines()
    old = keyring(services).open_checkpoint(lost)
    anchor = ledger_keys.read_anchor(ledger_keys.key_files(services.settings))
    assert lines[1] == "kandev-es re-anchor"
    assert lines[2] == f"old {old.size} {ledger._b64(old.root)}"
    assert lines[3] == f"new {anchor.size} {ledger._b64(anchor.root)}"
    assert lines[5] == "reason INC-42 restore of the 02:00 backup"
    assert "RE-ANCHORED by an operator" in done.stderr
    files = ledger_keys.key_files(services.settings)
    assert files.reanchors.read_text() == statement + "\n"

    services.ledger = restarted(services)  # a server started after the re-anchor
    note = logged(services, workspace, member, "R-4")  # waits for a covering checkpoint
    assert parse_checkpoint(split_note(note)[0]).size > anchor.size
    assert verify_ledger(services.app, services.database, keyring(services)).ok
    # The auditor's checkpoint from before the restore shows the fork, and the
    # report says an operator re-anchored it, when and why.
    assert not verify_ledger(services.app, services.database, keyring(services), lost).ok
    (tmp_path / "lost.txt").write_text(lost)
    audited = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / "lost.txt"))
    assert audited.exit_code == 1
    assert (f"note: an operator re-anchored the log after a restore: old {old.size}"
            in audited.stdout), audited.stdout
    assert "reason INC-42 restore of the 02:00 backup" in audited.stdout


def create_more(services, workspace, member, external_id) -> bool:
    from tests.integration.helpers import create

    return (
        create(
            services_client(services), member[1], external_id=external_id, title=external_id
        ).status_code
        == 200
    )


def test_a_tree_with_its_nodes_deleted_is_refused_not_retried_silently(
    services, workspace, member
):
    logged(services, workspace, member, "D-1")
    with in_the_store(services) as sql:
        sql.execute("DELETE FROM ledger_nodes")
    assert create_more(services, workspace, member, "D-2")
    before = checkpoints(services)
    refused_to_sign(services, "of the log's tree is missing")
    assert checkpoints(services) == before
