"""Issue 47, point 5, on both backends: a task whose events were written in
cleartext (format 0, before the upgrade; here KANDEV_SEAL_FREE_TEXT=false
writes them), with an upload whose file name is in cleartext, is forgotten
by rewriting those events with their free text null under a redaction
statement its Forgotten events record, signed by the log's key
(docs/auditing.md: Erasure). Forgotten between two checkpoints, every
checkpoint and proof issued before verifies unchanged with the public
keyring alone; bundles and `audit verify --ledger` after it report the
rewritten events "redacted by statement N, consistent"; tampering with what
remains of them, with the statement, or with their topic is caught, and so
is a statement another key signed; the protocol goes on; and the marker is
nowhere in the store after the documented VACUUM."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from kandev_es_client import ledger as chains
from kandev_es_client.verify import main as offline

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from kandev_es.domain.attachment import attachment_id_for
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.release import release_operation_id
from kandev_es.services import ledger
from kandev_es.services.ledger_audit import describe, verify_ledger
from kandev_es.storage.ledger import stream_key
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.test_forget import MARKER, forget, relation_files
from tests.integration.test_forget_attachments import upload
from tests.integration.test_ledger import keyring, logged
from tests.integration.test_release import lookup, release


@pytest.fixture
def plain(settings):
    """The store's services writing cleartext events (format 0), as before the upgrade."""
    services = bootstrap(dataclasses.replace(settings, seal_free_text=False))
    yield services
    services.close()


@dataclasses.dataclass
class Forgotten:
    services: object
    workspace: object
    member: tuple
    operator: tuple
    released: dict
    kept: dict
    first: str
    second: str
    before: dict


def forget_cleartext_between_checkpoints(plain, tmp_path) -> Forgotten:
    """Two cleartext tasks holding the marker (title, description, an edit;
    one released, so a release's stored answer holds it too), a checkpoint
    and bundles, both forgotten, a second checkpoint."""
    workspace = plain.workspaces.open("acme")
    member = plain.tokens.issue(workspace_id=workspace.id, admin=False)[::-1]
    operator = plain.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")[::-1]
    client = create_app(services=plain, run_projections=False).test_client()
    made = {}
    uploaded = upload(client, workspace, member[1], b"a scan")  # named with the marker
    for name in ("OLD-1", "OLD-2"):
        body = {"external_id": name, "title": f"{MARKER} {name}", "description": MARKER}
        if name == "OLD-1":
            body["attachments"] = [uploaded["id"]]
        made[name] = create(client, member[1], **body).json
        edited = client.patch(
            f"/api/v1/tasks/{made[name]['id']}",
            json={"description": f"{MARKER} again"},
            headers=bearer(member[1]),
        )
        assert edited.status_code == 200, edited.json
    assert release(client, workspace, operator[1], "OLD-1", "rel-1").status_code == 200
    stored = b"".join(bytes(n.state) for n in all_events(plain))
    assert MARKER.encode() in stored and b'"sealed"' not in stored  # format 0
    first = logged(plain, workspace, member)
    (tmp_path / "first.txt").write_text(first)
    before = {
        "identity": ledger.proof_bundle(plain.app, plain.database, workspace.id, "OLD-1"),
        "task": ledger.task_proof_bundle(plain.app, plain.database, uuid.UUID(made["OLD-1"]["id"])),
    }
    for kind, bundle in before.items():
        (tmp_path / f"before-{kind}.json").write_text(json.dumps(bundle))
    for n, name in enumerate(("OLD-1", "OLD-2")):
        forgot = forget(client, operator[1], made[name]["id"], key=f"erase-{n}")
        assert forgot.status_code == 200, forgot.json
    second = logged(plain, workspace, member)
    (tmp_path / "second.txt").write_text(second)
    made["OLD-1"]["upload"] = attachment_id_for(workspace.id, uploaded["sha256"])
    return Forgotten(
        plain, workspace, member, operator, made["OLD-1"], made["OLD-2"], first, second, before
    )


def all_events(services):
    return list(
        services.app.recorder.select_notifications(start=0, limit=100_000, inclusive_of_start=False)
    )


def test_a_cleartext_task_is_forgotten_under_a_statement_and_every_proof_holds(
    plain, cli, tmp_path
):
    done = forget_cleartext_between_checkpoints(plain, tmp_path)
    (tmp_path / "keyring.json").write_text(cli("audit", "keyring").stdout)
    ring = ["--keyring", str(tmp_path / "keyring.json")]
    events = all_events(plain)
    assert all(MARKER.encode() not in bytes(n.state) for n in events)
    task = uuid.UUID(done.released["id"])
    statement = next(
        json.loads(n.state)
        for n in events
        if n.originator_id == task and n.topic.endswith("Task.Forgotten")
    )
    entries = chains.redactions_in(json.dumps(statement).encode(), 0, keyring(plain), None)
    streams = {str(e.stream) for e in entries}  # a note the log's key signed
    operation = release_operation_id(done.workspace.id, "rel-1")
    identity = identity_id(done.workspace.id, "OLD-1")
    upload_stream = done.released["upload"]
    assert streams == {str(task), str(identity), str(operation), str(upload_stream)}
    assert MARKER not in json.dumps(statement)

    # What was issued before verifies unchanged, with the keyring alone.
    for kind in ("identity", "task"):
        assert offline(["bundle", str(tmp_path / f"before-{kind}.json"), *ring]) == 0
    assert offline(["checkpoint", str(tmp_path / "first.txt"), *ring]) == 0
    proof = cli("audit", "consistency", "--from", done.first.split("\n")[1]).stdout
    (tmp_path / "consistency.json").write_text(proof)
    assert offline(["consistency", str(tmp_path / "consistency.json"), *ring]) == 0

    # Bundles issued after: the rewritten events verify by their statement.
    size = int(done.first.split("\n")[1])
    after = {
        "identity": ledger.proof_bundle(
            plain.app, plain.database, done.workspace.id, "OLD-1", [size]
        ),
        "task": ledger.task_proof_bundle(plain.app, plain.database, task, [size]),
    }
    for kind, bundle in after.items():
        assert MARKER not in json.dumps(bundle)
        report = chains.verify_bundle(
            bundle, keyring(plain), held=[keyring(plain).open_checkpoint(done.first)]
        )
        assert report.ok, report.lines()
        assert any("redacted by statement" in line for line in report.lines()), report.lines()
        (tmp_path / f"after-{kind}.json").write_text(json.dumps(bundle))
        held = ["--checkpoint", str(tmp_path / "first.txt")]
        assert offline(["bundle", str(tmp_path / f"after-{kind}.json"), *ring, *held]) == 0

    page = ledger.identity_verification(  # the auditor's page's Tamper evidence
        plain.app, plain.database, plain.settings, done.workspace.id, "OLD-1"
    )
    assert page["state"] == "verified", page
    assert "  v2 Claimed: verified, redacted by statement v8, consistent" in page["lines"]

    for checkpoint in ("first.txt", "second.txt"):
        verified = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / checkpoint))
        assert verified.exit_code == 0, verified.output
        assert f"task {task}: forgotten, consistent" in verified.stdout
        assert f"stream {operation} version 1: redacted by statement" in verified.stdout
        assert verified.stdout.splitlines()[-1] == "OK"
    protocol_goes_on(done)
    marker_is_nowhere(plain, cli)


def protocol_goes_on(done: Forgotten) -> None:
    """Read, retry (Found, forgotten), lookup, history, release and a replayed
    forget on the forgotten tasks; a rebuild gives the same read models."""
    from projections.rebuild import rebuild

    services = done.services
    client = create_app(services=services, run_projections=False).test_client()
    secret = done.member[1]
    got = client.get(f"/api/v1/tasks/{done.kept['id']}", headers=bearer(secret)).json
    assert (got["title"], got["description"], got["forgotten"]) == (None, None, True)
    retried = create(client, secret, external_id="OLD-2", title="again")
    assert retried.status_code == 200 and retried.json["id"] == done.kept["id"]
    assert retried.json["title"] is None and retried.json["forgotten"] is True
    history = client.get(
        f"/api/v1/workspaces/{done.workspace.id}/identities/history",
        query_string={"external_id": "OLD-1"},
        headers=bearer(done.operator[1]),
    )
    assert history.status_code == 200 and MARKER not in history.get_data(as_text=True)
    found = lookup(client, done.workspace, secret, "OLD-2")
    assert found.status_code == 200 and found.json["title"] is None, found.json
    again = forget(client, done.operator[1], done.kept["id"], key="erase-again")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    released = release(client, done.workspace, done.operator[1], "OLD-2", "rel-2")
    assert released.status_code == 200 and released.json["title"] is None, released.json
    services.projections.catch_up()
    with services.database.transaction() as tx:
        live = sorted(map(str, tx.execute("SELECT task_id, revision, dto FROM tasks_view")))
    for name in ("tasks", "identities", "feeds"):
        rebuild(services.projections, name, batch_size=3)
    with services.database.transaction() as tx:
        rebuilt = sorted(map(str, tx.execute("SELECT task_id, revision, dto FROM tasks_view")))
    assert rebuilt == live and MARKER not in repr(rebuilt)


# docs/operations.md: Erasure, the PostgreSQL steps for a task written before
# the upgrade (its events' rows were rewritten too).
DOCUMENTED = (
    "VACUUM FULL task_keys; VACUUM FULL tasks_view; VACUUM FULL feed_tasks;"
    " VACUUM FULL feed_events; VACUUM FULL kandev_events; CHECKPOINT;"
)


def marker_is_nowhere(services, cli) -> None:
    settings = services.settings
    services.close()
    if settings.postgres is None:
        import sqlite3

        with sqlite3.connect(settings.sqlite_path) as connection:  # docs/operations.md
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.execute("VACUUM")
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for path in (p for p in Path(settings.data_dir).rglob("*") if p.is_file()):
            assert MARKER.encode() not in path.read_bytes(), path
        return
    for path in documented_steps_then_files(settings.postgres.schema):
        assert MARKER.encode() not in path.read_bytes(), path


def documented_steps_then_files(schema):
    """Only the documented statements, then every table file of the schema."""
    import psycopg

    from tests.conftest import postgres_admin_url

    with psycopg.connect(postgres_admin_url(), autocommit=True) as connection:
        connection.execute(f'SET search_path TO "{schema}"')
        for statement in DOCUMENTED.split(";")[:-1]:
            connection.execute(statement)
        bases = relation_files(connection, schema)
    assert len(bases) > 10
    return [
        path
        for base in bases
        for path in [base, *base.parent.glob(base.name + ".*")]
        if path.is_file() and not path.name.endswith(("_fsm", "_vm"))
    ]


def set_column(services, stream, version, column, value):
    table = services.app.recorder.events_table_name
    with services.database.transaction() as tx:
        (old,) = tx.execute(
            f"SELECT {column} FROM {table} WHERE originator_id = ? AND originator_version = ?",
            (stream_key(services.database.backend, stream), version),
        )[0]
        tx.execute(
            f"UPDATE {table} SET {column} = ? WHERE originator_id = ? AND originator_version = ?",
            (value(old), stream_key(services.database.backend, stream), version),
        )
    return old


def test_tampering_with_a_redacted_event_or_its_statement_is_caught(plain, tmp_path):
    done = forget_cleartext_between_checkpoints(plain, tmp_path)
    held = (tmp_path / "first.txt").read_text()
    task = uuid.UUID(done.released["id"])
    report = verify_ledger(plain.app, plain.database, keyring(plain), held)
    assert report.ok, describe(report)
    forgotten_at = max(n.originator_version for n in all_events(plain) if n.originator_id == task)
    cases = {
        # what remains of the rewritten Created: its workflow step changed
        (task, 1, "state"): lambda old: bytes(old).replace(b'"backlog"', b'"done"'),
        # the redacted bytes passed off under another topic
        (task, 1, "topic"): lambda old: old.replace("Task.Created", "Task.Updated"),
        # the statement edited: its redacted hash no longer the one logged
        (task, forgotten_at, "state"): lambda old: bytes(old).replace(
            b"redaction-statement/v1", b"redaction-statement/v2"
        ),
    }
    for (stream, version, column), change in cases.items():
        old = set_column(plain, stream, version, column, change)
        try:
            failed = verify_ledger(plain.app, plain.database, keyring(plain), held)
            lines = describe(failed)
            assert not failed.ok, (column, lines)
            assert any(f"stream {stream} version {version}" in line for line in lines), lines
            assert any(
                line.startswith(f"  task {task}: forgotten, INCONSISTENT") for line in lines
            ), lines
            bundle = ledger.task_proof_bundle(plain.app, plain.database, task)
            assert not chains.verify_bundle(bundle, keyring(plain)).ok
        finally:
            set_column(plain, stream, version, column, lambda _, old=old: old)
    assert verify_ledger(plain.app, plain.database, keyring(plain), held).ok


def test_a_statement_not_signed_by_the_logs_key_redacts_nothing(plain, tmp_path):
    """What a database writer without the key could log: a Forgotten event
    whose statement another key signed. The events it names are not taken
    as redacted: they changed since they were logged."""
    from kandev_es_client.signed_note import generate_signer

    from kandev_es.domain.principal import LOCAL_CLI
    from kandev_es.erasure.service import ForgetService
    from kandev_es.errors import LedgerRefused
    from kandev_es.services.ledger_keys import load_keyring

    workspace = plain.workspaces.open("acme")
    member = plain.tokens.issue(workspace_id=workspace.id, admin=False)[::-1]
    client = create_app(services=plain, run_projections=False).test_client()
    task = uuid.UUID(create(client, member[1], external_id="OLD-9", title=MARKER).json["id"])
    logged(plain, workspace, member)

    def no_key():
        raise LedgerRefused("the checkpoint signing key is missing")

    before = [bytes(n.state) for n in all_events(plain)]
    with pytest.raises(LedgerRefused):  # 503: the statement cannot be signed, nothing written
        ForgetService(plain.app, plain.database, no_key).forget(
            LOCAL_CLI, task, "art. 17", "erase-9"
        )
    assert [bytes(n.state) for n in all_events(plain)] == before
    forged = generate_signer(keyring(plain).entries[0].verifier.name)  # same origin, other key
    ForgetService(plain.app, plain.database, lambda: forged).forget(
        LOCAL_CLI, task, "art. 17", "erase-9"
    )
    logged(plain, workspace, member)
    report = verify_ledger(plain.app, plain.database, keyring(plain))
    lines = describe(report)
    assert not report.ok
    assert any("a redaction statement does not verify" in line for line in lines), lines
    assert any(f"stream {task} version 1: changed since it was logged" in line for line in lines)
    assert any(line.startswith(f"  task {task}: forgotten, INCONSISTENT") for line in lines)
    bundle = ledger.task_proof_bundle(plain.app, plain.database, task)
    assert not chains.verify_bundle(bundle, keyring(plain)).ok

    # A retired key's holder: the key signs no statement for a place in the
    # log after its window (as it signs no checkpoint there).
    retired = ledger.load_signer(plain.settings)
    ledger.rotate_key(plain.database, plain.settings)
    later = uuid.UUID(create(client, member[1], external_id="OLD-10", title=MARKER).json["id"])
    logged(plain, workspace, member)
    ForgetService(plain.app, plain.database, lambda: retired).forget(
        LOCAL_CLI, later, "art. 17", "erase-10"
    )
    logged(plain, workspace, member)
    ring = load_keyring(plain.settings)
    assert len(ring.entries) == 2
    lines = describe(verify_ledger(plain.app, plain.database, ring))
    assert any(
        line.startswith(f"  stream {later} version ")
        and "a redaction statement does not verify" in line
        for line in lines
    ), lines
    assert any(line.startswith(f"  task {later}: forgotten, INCONSISTENT") for line in lines)


def test_a_forget_stopped_before_its_rewrite_is_named_and_finished_by_a_second(
    plain, tmp_path, monkeypatch
):
    """The statement is saved first, the rewrite follows: a process that
    stops between the two leaves events that still verify (their cleartext
    hashes to their chain) and that the audit names; a second forget (any
    key) rewrites them, and only what the statement names (here the
    statement was made to leave the identity's Claimed out)."""
    from kandev_es.erasure import redaction

    workspace = plain.workspaces.open("acme")
    member = plain.tokens.issue(workspace_id=workspace.id, admin=False)[::-1]
    operator = plain.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")[::-1]
    client = create_app(services=plain, run_projections=False).test_client()
    task = create(client, member[1], external_id="OLD-5", title=MARKER).json["id"]
    logged(plain, workspace, member)
    statement = redaction.statement
    with monkeypatch.context() as patched:
        patched.setattr(redaction, "apply", lambda *args: 0)  # stopped before it
        patched.setattr(redaction, "statement", lambda *args: [
            e for e in statement(*args) if str(e.stream) == task
        ])  # fmt: skip
        assert forget(client, operator[1], task, key="erase-5").status_code == 200
    logged(plain, workspace, member)
    report = verify_ledger(plain.app, plain.database, keyring(plain))
    lines = describe(report)
    assert not report.ok and MARKER.encode() in b"".join(bytes(n.state) for n in all_events(plain))
    assert any(f"stream {task} version 1: forgotten, but it still holds" in line for line in lines)
    again = forget(client, operator[1], task, key="erase-other")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    holding = [n for n in all_events(plain) if MARKER.encode() in bytes(n.state)]
    assert [n.topic.rsplit(".", 1)[-1] for n in holding] == ["Claimed"]  # not named: left
    assert verify_ledger(plain.app, plain.database, keyring(plain)).ok
