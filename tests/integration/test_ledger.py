"""Tamper-evident history on both backends (docs/auditing.md): the sequencer logs
every event in settled order and signs checkpoints; an identity's proof bundle
verifies offline with only the public key; a consistency proof links two
checkpoints; and ``audit verify --ledger`` finds each kind of tampering done in
SQL against an earlier checkpoint, naming the stream and version."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from kandev_es_client import ledger as chains
from kandev_es_client import merkle

from kandev_es.domain.external_id import identity_id
from kandev_es.services import ledger
from kandev_es.services.ledger_audit import verify_ledger
from kandev_es.services.ledger_keys import load_keyring
from kandev_es.storage.ledger import stored_chain_hashes
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.tampering import TAMPERING


def logged(services, workspace, member, *external_ids):
    """Create a task per external id, then sequence and sign until a checkpoint
    covers every stored event: on a shared PostgreSQL another database's open
    transaction can hold the settled prefix (the cluster's xmin) a moment
    behind a commit, and a checkpoint signed then would leave the new events
    out (this test failed about 1 run in 6 that way)."""
    for external_id in external_ids:
        assert create(services_client(services), member[1], external_id=external_id,
                      title=external_id).status_code == 200
    stored = len(list(services.app.recorder.select_notifications(
        start=0, limit=10_000, inclusive_of_start=False)))  # ids may have gaps: count
    deadline = time.monotonic() + 20
    while True:
        note = services.ledger.catch_up()
        # Every key with its window: right after a key rotation, the last
        # checkpoint catch_up finds may still be the retired key's.
        ring = load_keyring(services.settings)
        if note is not None and ring.open_checkpoint(note).size >= stored:
            return note
        assert time.monotonic() < deadline, "no checkpoint covers the events just stored"
        time.sleep(0.05)


def services_client(services):
    from kandev_es.api import create_app

    return create_app(services=services, run_projections=False).test_client()


def keyring(services):
    return ledger.keyring_of(ledger.load_signer(services.settings))


def test_every_event_is_logged_and_a_bundle_verifies_offline(services, workspace, member):
    first = logged(services, workspace, member, "LEDGER-1", "LEDGER-2")
    ring = keyring(services)
    checkpoint = ring.open_checkpoint(first)
    events = list(services.app.recorder.select_notifications(start=0, limit=10_000,
                                                             inclusive_of_start=False))
    assert checkpoint.size == len(events)
    assert ledger.key_file_mode(services.settings.ledger_key_path) == 0o600

    bundle = ledger.proof_bundle(services.app, services.database, workspace.id, "LEDGER-1")
    report = chains.verify_bundle(bundle, ring)
    assert report.ok, report.lines()
    assert {f.status for f in report.findings} == {"verified"}
    assert bundle["events"][-1]["event"] == "Completed"

    second = logged(services, workspace, member, "LEDGER-3")
    proof = ledger.consistency(services.database, checkpoint.size, None)
    old, new = chains.verify_consistency_bundle(proof, ring)
    assert (old, new) == (checkpoint, ring.open_checkpoint(second))
    assert verify_ledger(services.app, services.database, ring, first).ok


def test_the_save_chains_each_event_and_the_log_matches_a_tree_built_in_memory(
    services, workspace, member
):
    logged(services, workspace, member, "TREE-1")
    events = list(services.app.recorder.select_notifications(start=0, limit=10_000,
                                                             inclusive_of_start=False))
    with services.database.transaction() as tx:
        saved = stored_chain_hashes(tx, services.database.backend,
                                    services.app.recorder.events_table_name)
    memory, last = merkle.MemoryTree(), {}
    for n in events:
        value = chains.chain_hash(n.originator_id, n.originator_version,
                                  last.get(n.originator_id, chains.GENESIS), n.topic, n.state)
        assert saved[n.id] == value, n  # written by the save itself, on both backends
        last[n.originator_id] = value
        memory.append(value)
    note = ledger.latest_checkpoint(services.database)
    assert keyring(services).open_checkpoint(note).root == memory.root()
    key = identity_id(workspace.id, "TREE-1")
    assert uuid.UUID(ledger.proof_bundle(services.app, services.database, workspace.id,
                                         "TREE-1")["stream_id"]) == key


@pytest.mark.parametrize("tamper", ["edit", "delete", "swap", "cut", "drop_stream", "rewrite"])
def test_tampering_is_found_against_an_earlier_checkpoint(
    services, workspace, member, backend, tamper
):
    logged(services, workspace, member, "T-1")
    kept = logged(services, workspace, member, "T-2")  # the auditor's copy
    stream = identity_id(workspace.id, "T-2")
    version = TAMPERING[tamper](services, stream)
    report = verify_ledger(services.app, services.database, keyring(services), kept)
    assert not report.ok
    lines = [p.line() for p in report.problems]
    assert any(f"{stream} v{version}" in line or f"{stream} version {version}" in line
               for line in lines), lines
    clean = [p for p in report.problems if p.stream and p.stream != str(stream)]
    assert not clean, lines


def test_the_commands_print_a_checkpoint_a_proof_and_verify_the_ledger(
    cli, services, workspace, member, tmp_path
):
    logged(services, workspace, member, "CLI-1")
    printed = cli("audit", "checkpoint", "--now")
    assert printed.exit_code == 0, printed.output
    (tmp_path / "checkpoint").write_text(printed.stdout)
    (tmp_path / "keyring.json").write_text(cli("audit", "keyring").stdout)
    bundle = cli("identity", "history", "--workspace", "acme", "--external-id", "CLI-1",
                 "--proof")
    assert bundle.exit_code == 0, bundle.output
    (tmp_path / "bundle.json").write_text(bundle.stdout)
    from kandev_es_client.verify import main as offline

    assert offline(["bundle", str(tmp_path / "bundle.json"),
                    "--keyring", str(tmp_path / "keyring.json")]) == 0
    verified = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / "checkpoint"),
                   "--keyring", str(tmp_path / "keyring.json"))
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.splitlines()[-1] == "OK"
    TAMPERING["edit"](services, identity_id(workspace.id, "CLI-1"))
    failed = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / "checkpoint"))
    assert failed.exit_code == 1
    assert f"stream {identity_id(workspace.id, 'CLI-1')} version 2: changed" in failed.stdout
    # The bundle was taken before the edit: it still verifies offline.
    assert offline(["bundle", str(tmp_path / "bundle.json"),
                    "--keyring", str(tmp_path / "keyring.json")]) == 0


def test_the_routes_serve_proofs_checkpoints_and_typed_refusals(
    client, services, workspace, member, operator
):
    first = logged(services, workspace, member, "ROUTE-1")
    ring = keyring(services)
    path = f"/api/v1/workspaces/{workspace.id}/identities/history"
    answer = client.get(path, query_string={"external_id": "ROUTE-1", "proof": "1"},
                        headers=bearer(operator[1]))
    assert answer.status_code == 200, answer.json
    assert chains.verify_bundle(answer.json["proof"], ring).ok
    assert "proof" not in client.get(path, query_string={"external_id": "ROUTE-1"},
                                     headers=bearer(operator[1])).json
    assert client.get(path, query_string={"external_id": "ROUTE-1", "proof": "1"},
                      headers=bearer(member[1])).status_code == 403
    second = logged(services, workspace, member, "ROUTE-2")
    latest = client.get("/api/v1/ledger/checkpoint", headers=bearer(member[1]))
    assert latest.json == {"checkpoint": second}
    size = ring.open_checkpoint(first).size
    proof = client.get("/api/v1/ledger/consistency", query_string={"from": size},
                       headers=bearer(member[1]))
    assert chains.verify_consistency_bundle(proof.json, ring)[0].size == size
    for query, status in (({"from": "x"}, 400), ({"from": "0"}, 400), ({}, 400),
                          ({"from": size + 1_000}, 404)):
        refused = client.get("/api/v1/ledger/consistency", query_string=query,
                             headers=bearer(member[1]))
        assert refused.status_code == status, (query, refused.json)
    assert client.get("/api/v1/ledger/checkpoint").status_code == 404  # no token: nothing
    page = f"/audit/identities?workspace={workspace.id}&external_id=ROUTE-1"
    assert "events verified up to the checkpoint" in client.get(
        page, headers=bearer(operator[1])).get_data(as_text=True)
    TAMPERING["edit"](services, identity_id(workspace.id, "ROUTE-1"))
    shown = client.get(page, headers=bearer(operator[1])).get_data(as_text=True)
    assert "FAILED against the checkpoint" in shown and "v2" in shown


def ledger_writes() -> float:
    """The background writes the ledger counted in this process (/metrics)."""
    from kandev_es import metrics

    value = metrics.instruments().registry.get_sample_value(
        "kandev_background_write_transactions_total", {"writer": "ledger"}
    )
    return value or 0.0


def test_a_sequencer_pass_appends_and_signs_in_one_write_and_an_idle_pass_writes_nothing(
    services, workspace, member
):
    import dataclasses

    # A checkpoint is due at every event, so the pass that appends signs too.
    sequencer = ledger.Sequencer(
        services.app, services.database,
        dataclasses.replace(services.settings, ledger_checkpoint_events=1),
    )
    services.ledger = sequencer
    logged(services, workspace, member)  # every stored event in the log (see logged())
    writes = ledger_writes()
    assert (sequencer.run_once(), sequencer.checkpoint_if_due()) == (0, None)
    assert ledger_writes() == writes

    assert create(services_client(services), member[1], external_id="SEQ-1",
                  title="SEQ-1").status_code == 200
    deadline = time.monotonic() + 20  # another database's transaction may hold the settled head
    while (appended := sequencer.run_once()) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert appended == 4  # an effect-free creation's four events, in one pass
    assert ledger_writes() == writes + 1
    with services.database.transaction() as tx:
        size, _ = ledger.store.tree_head(tx)
        assert ledger.store.latest_checkpoint(tx)[0] == size
        if services.database.backend == "postgres":  # one transaction wrote both
            [(leaf_xmin,)] = tx.execute(
                "SELECT xmin::text FROM ledger_leaves ORDER BY leaf_index DESC LIMIT 1")
            [(checkpoint_xmin,)] = tx.execute(
                "SELECT xmin::text FROM ledger_checkpoints ORDER BY tree_size DESC LIMIT 1")
            assert leaf_xmin == checkpoint_xmin
    assert (sequencer.run_once(), sequencer.checkpoint_if_due()) == (0, None)
    assert ledger_writes() == writes + 1


def test_a_bundle_proves_it_extends_the_auditors_checkpoint(
    cli, client, services, workspace, member, operator, tmp_path
):
    """kandev-es-verify --checkpoint: the auditor's own checkpoint, not the
    bundle's, decides what must be proven; a bundle against an older
    checkpoint (where a later event could pass as pending) fails."""
    from kandev_es_client.verify import main as offline

    old_note = logged(services, workspace, member, "HELD-1")
    old_size = keyring(services).open_checkpoint(old_note).size
    old_bundle = cli("identity", "history", "--workspace", "acme", "--external-id", "HELD-1",
                     "--proof").stdout
    held_note = logged(services, workspace, member, "HELD-2")
    held_size = keyring(services).open_checkpoint(held_note).size
    (tmp_path / "keyring.json").write_text(cli("audit", "keyring").stdout)
    (tmp_path / "held.txt").write_text(held_note)
    (tmp_path / "old.txt").write_text(old_note)
    mine = ["--keyring", str(tmp_path / "keyring.json"), "--checkpoint",
            str(tmp_path / "held.txt"), "--checkpoint", str(tmp_path / "old.txt")]

    (tmp_path / "stale.json").write_text(old_bundle)
    assert offline(["bundle", str(tmp_path / "stale.json"), *mine]) == 1
    logged(services, workspace, member, "HELD-3")  # the log moves on past the auditor's
    bundle = cli("identity", "history", "--workspace", "acme", "--external-id", "HELD-1",
                 "--proof", "--consistency-from", str(held_size), "--consistency-from",
                 str(old_size))
    assert bundle.exit_code == 0, bundle.output
    (tmp_path / "bundle.json").write_text(bundle.stdout)
    assert offline(["bundle", str(tmp_path / "bundle.json"), *mine]) == 0
    without = cli("identity", "history", "--workspace", "acme", "--external-id", "HELD-1",
                  "--proof").stdout
    (tmp_path / "without.json").write_text(without)
    assert offline(["bundle", str(tmp_path / "without.json"), *mine]) == 1

    path = f"/api/v1/workspaces/{workspace.id}/identities/history"
    answer = client.get(path, query_string={"external_id": "HELD-1", "proof": "1",
                                            "consistency_from": [str(held_size)]},
                        headers=bearer(operator[1]))
    assert answer.status_code == 200, answer.json
    assert [c["from_size"] for c in answer.json["proof"]["consistency"]] == [held_size]
    held = [keyring(services).open_checkpoint(held_note)]
    assert chains.verify_bundle(answer.json["proof"], keyring(services), held=held).ok
    for bad in ("0", "x", "1.5", "Infinity", ["1"] * 17):
        refused = client.get(path, query_string={"external_id": "HELD-1", "proof": "1",
                                                 "consistency_from": bad},
                             headers=bearer(operator[1]))
        assert refused.status_code == 400, (bad, refused.json)


def test_audit_checkpoints_lists_the_signed_sizes(cli, services, workspace, member):
    empty = cli("audit", "checkpoints")
    assert (empty.exit_code, empty.stdout) == (0, "no signed checkpoint\n")
    notes = [logged(services, workspace, member, f"SIZES-{n}") for n in range(3)]
    sizes = [keyring(services).open_checkpoint(note).size for note in notes]
    listed = cli("audit", "checkpoints", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["checkpoints"]
    assert [r["size"] for r in rows] == sorted(r["size"] for r in rows)
    assert set(sizes) <= {r["size"] for r in rows}
    for row in rows:  # each one verifies and is the checkpoint of its size
        checkpoint = keyring(services).open_checkpoint(row["note"])
        assert (checkpoint.size, checkpoint.origin) == (row["size"], row["origin"])
        assert base64.b64encode(checkpoint.root).decode() == row["root"]
    table = cli("audit", "checkpoints").stdout.splitlines()
    assert table[0].split() == ["SIZE", "SIGNED", "AT", "(UTC)", "ROOT", "ORIGIN"]
    assert [int(line.split()[0]) for line in table[1:]] == [r["size"] for r in rows]
    assert table[-1].split()[2:] == [rows[-1]["root"], rows[-1]["origin"]]
    newest = json.loads(cli("audit", "checkpoints", "--json", "--limit", "1").stdout)
    assert [r["size"] for r in newest["checkpoints"]] == [rows[-1]["size"]]
    oldest = json.loads(cli("audit", "checkpoints", "--json", "--limit", "1", "--oldest",
                            "--after", str(sizes[0])).stdout)
    assert [r["size"] for r in oldest["checkpoints"]] == [
        min(r["size"] for r in rows if r["size"] > sizes[0])]
    assert cli("audit", "checkpoints", "--limit", "0").exit_code == 2


def test_a_bundle_without_its_completed_fails_and_the_map_is_the_logs(
    services, workspace, member
):
    """Issue 43: deleting an identity's Completed left its bundle verifying;
    each checkpoint now commits every stream's head (its map root matches
    one rebuilt from the log's leaves), so the bundle shows the event missing."""
    from kandev_es_client import heads

    note = logged(services, workspace, member, "WHOLE-1", "WHOLE-2")
    ring = keyring(services)
    checkpoint = ring.open_checkpoint(note)
    with services.database.transaction() as tx:
        leaves = ledger.store.leaves_page(tx, -1, 10_000)
    latest = {}
    for _, _, stream, version, value in leaves:
        latest[uuid.UUID(str(stream))] = heads.Head(uuid.UUID(str(stream)), version, value)
    assert heads.extension_root(checkpoint.extensions) == heads.memory_root(latest.values())

    stream = identity_id(workspace.id, "WHOLE-1")
    bundle = ledger.proof_bundle(services.app, services.database, workspace.id, "WHOLE-1")
    report = chains.verify_bundle(bundle, ring)
    assert report.ok and report.completeness.startswith("complete"), report.lines()
    completed = latest[stream].version
    table, key = services.app.recorder.events_table_name, ledger.store.stream_key(
        services.database.backend, stream)
    with services.database.transaction() as tx:  # the attacker, in SQL
        tx.execute(f"DELETE FROM {table} WHERE originator_id = ? AND originator_version = ?",
                   (key, completed))
    bundle = ledger.proof_bundle(services.app, services.database, workspace.id, "WHOLE-1")
    assert [e["event"] for e in bundle["events"]][-1] != "Completed"
    report = chains.verify_bundle(bundle, ring)
    assert not report.ok
    assert report.problem == (f"1 event(s) missing: the checkpoint commits the stream's head as"
                              f" v{completed}, the bundle ends at v{completed - 1}")


def test_a_changed_map_of_stream_heads_is_never_signed(cli, services, workspace, member):
    """An attacker who changes a stream's head in the map's tables, or empties
    them, would have the next checkpoint commit a wrong map: the signer
    refuses instead, and signs again once the map is rebuilt from the log."""
    from kandev_es.errors import LedgerRefused
    from tests.integration.test_ledger_save_chains import save

    stream = uuid.uuid4()
    save(services, stream, range(1, 2))
    first = logged(services, workspace, member, "MAP-1")
    size = keyring(services).open_checkpoint(first).size
    key = ledger.store.stream_key(services.database.backend, stream)

    def refused_with(said):
        with pytest.raises(LedgerRefused) as refused:
            services.ledger.catch_up()
        assert said in refused.value.message
        assert ledger.latest_checkpoint(services.database) == first  # nothing signed

    with services.database.transaction() as tx:  # the stream's head said to be another
        tx.execute("UPDATE ledger_heads SET chain_hash = ? WHERE originator_id = ?",
                   (bytes(32), key))
    save(services, stream, range(2, 3))  # its bucket changes in the next checkpoint
    refused_with("are not those its map committed to: the ledger_heads table was changed")
    with services.database.transaction() as tx:
        tx.execute("DELETE FROM ledger_heads")
        tx.execute("DELETE FROM ledger_map_nodes")
    refused_with(f"is not the one the checkpoint of size {size} committed to")
    rebuilt = cli("audit", "rebuild-heads")
    assert rebuilt.exit_code == 0, rebuilt.output
    assert f"it described the log at size {size}" in rebuilt.stdout
    note = services.ledger.catch_up()
    assert keyring(services).open_checkpoint(note).size == size + 1
    assert verify_ledger(services.app, services.database, keyring(services)).ok


def test_a_wrong_map_signed_is_found_by_the_audit(services, workspace, member):
    """A checkpoint signed by the log's key with a map that is not the log's
    (what a signer without the map's checks could have signed): the full
    audit rebuilds the map from the leaves and names it."""
    from kandev_es_client import heads
    from kandev_es_client import signed_note as sn

    note = logged(services, workspace, member, "WRONG-1")
    real = keyring(services).open_checkpoint(note)
    wrong = sn.Checkpoint(real.origin, real.size, real.root,
                          (heads.extension_line(heads.memory_root([])),))
    forged = sn.sign_note(wrong.text(), ledger.load_signer(services.settings))
    with services.database.transaction() as tx:
        tx.execute("UPDATE ledger_checkpoints SET note = ? WHERE tree_size = ?",
                   (forged, real.size))
    report = verify_ledger(services.app, services.database, keyring(services))
    assert [p.line() for p in report.problems] == [
        f"stored checkpoint {real.size} (size {real.size}): its map of stream heads is not the"
        " log's: a stream's last event there is not the one the checkpoint commits to"]


def test_a_tasks_bundle_without_its_title_change_fails(cli, services, workspace, member):
    """Issue 43: a task's title change deleted from the store left nothing to
    notice but the full audit; the task's own bundle (audit task-proof) now
    fails, its head being committed in the checkpoint's map."""
    from tests.integration.helpers import create as create_task

    client = services_client(services)
    made = create_task(client, member[1], external_id="TITLE-1", title="first")
    task_id = made.json["task"]["id"] if "task" in made.json else made.json["id"]
    assert client.patch(f"/api/v1/tasks/{task_id}", json={"title": "second"},
                        headers=bearer(member[1])).status_code == 200
    logged(services, workspace, member)
    printed = cli("audit", "task-proof", "--task-id", task_id)
    assert printed.exit_code == 0, printed.output
    bundle = json.loads(printed.stdout)
    assert (bundle["task_id"], bundle["workspace_id"]) == (task_id, str(workspace.id))
    report = chains.verify_bundle(bundle, keyring(services))
    assert report.ok and "complete" in report.completeness, report.lines()
    updated = [e["version"] for e in bundle["events"] if e["event"] == "Updated"]
    assert updated, [e["event"] for e in bundle["events"]]
    relabelled = dict(bundle, task_id=str(uuid.uuid4()))
    assert "whose stream is" in chains.verify_bundle(relabelled, keyring(services)).problem

    table = services.app.recorder.events_table_name
    key = ledger.store.stream_key(services.database.backend, uuid.UUID(task_id))
    with services.database.transaction() as tx:  # the attacker, in SQL
        tx.execute(f"DELETE FROM {table} WHERE originator_id = ? AND originator_version = ?",
                   (key, updated[-1]))
    report = chains.verify_bundle(ledger.task_proof_bundle(
        services.app, services.database, uuid.UUID(task_id)), keyring(services))
    assert not report.ok
    assert report.problem.startswith("1 event(s) missing: the checkpoint commits the stream's"
                                     f" head as v{updated[-1]}")
    assert cli("audit", "task-proof", "--task-id", str(uuid.uuid4())).exit_code == 1
