"""The checkpoint key (docs/auditing.md, "Keys, the origin and rotation"): a
deployment's first start makes a key and a keyring with an origin of its own;
a key lost after signing is never silently replaced (signing stops until
``audit rotate-key``, which records the new key's window in the keyring); a
key file its group or others may read is refused at start. Both backends."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
from kandev_es_client.signed_note import (
    Checkpoint,
    NoteError,
    generate_signer,
    parse_keyring,
    sign_note,
)

from kandev_es.bootstrap import init_storage
from kandev_es.errors import LedgerKeyUnsafe
from kandev_es.services import ledger, ledger_keys
from kandev_es.services.ledger_audit import verify_ledger
from tests.integration.test_ledger import logged, services_client
from tests.integration.test_ledger_anchor import (
    checkpoints,
    create_more,
    refused_to_sign,
    restarted,
)


def test_the_first_start_makes_a_key_with_an_origin_of_its_own(services, workspace, member):
    files = ledger_keys.key_files(services.settings)
    ring = parse_keyring(files.keyring.read_text())
    origin = ring.origin
    assert re.fullmatch(r"kandev-es\.local/log/[0-9a-f]{32}", origin or ""), origin
    assert [(e.from_size, e.until_size) for e in ring.entries] == [(0, None)]
    signer = ledger.load_signer(services.settings)
    assert signer.name == origin and ring.entries[0].verifier == signer.verifier
    for path in (files.key, files.keyring):
        assert path.stat().st_mode & 0o777 == 0o600
    note = logged(services, workspace, member, "K-1")
    assert ring.open_checkpoint(note).origin == origin
    # The verifier requires the deployment's origin: the same key signing as
    # another log (the old shared default) is refused.
    checkpoint = ring.open_checkpoint(note)
    elsewhere = Checkpoint("kandev-es.local/log", checkpoint.size, checkpoint.root)
    with pytest.raises(NoteError, match="origin"):
        ring.open_checkpoint(sign_note(elsewhere.text(), signer))
    with pytest.raises(NoteError, match="origin"):
        parse_keyring(ring.to_json()).open_checkpoint(sign_note(elsewhere.text(), signer))


def test_another_deployment_gets_another_origin(settings, tmp_path):
    other = dataclasses.replace(settings, data_dir=tmp_path / "other")
    for each in (settings, other):
        ledger_keys.ensure_key(each, signed_before=False)
    origins = {parse_keyring(ledger_keys.key_files(each).keyring.read_text()).origin
               for each in (settings, other)}
    assert len(origins) == 2, origins


def test_a_lost_key_stops_signing_until_an_operator_rotates_it(
    services, workspace, member, cli, caplog
):
    old_note = logged(services, workspace, member, "L-1")
    files = ledger_keys.key_files(services.settings)
    old_ring = parse_keyring(files.keyring.read_text())
    signed = old_ring.open_checkpoint(old_note).size
    files.key.unlink()

    with caplog.at_level(logging.ERROR, logger="kandev_es.ledger"):
        init_storage(services.settings)  # a restart: no new key is made
    assert not files.key.exists()
    assert any("is missing" in r.getMessage() for r in caplog.records)
    assert create_more(services, workspace, member, "L-2")
    refused_to_sign(services, "audit rotate-key")
    assert checkpoints(services)[-1] == signed
    init = cli("db", "init")
    assert init.exit_code == 1 and "is missing" in init.output
    assert not files.key.exists()
    ready = services_client(services).get("/readyz")
    assert ready.json["status"] == "degraded" and "is missing" in ready.json["ledger_refused"]
    # /readyz needs no token: it names the file, not where the data directory is.
    assert f"{files.key.name} is missing" in ready.json["ledger_refused"]
    assert str(files.key.parent) not in ready.json["ledger_refused"]

    rotated = cli("audit", "rotate-key")
    assert rotated.exit_code == 0, rotated.output
    assert "KEY ROTATED by an operator" in rotated.stderr
    ring = parse_keyring(rotated.stdout)
    assert ring.origin == old_ring.origin
    assert [(e.from_size, e.until_size) for e in ring.entries] == [
        (0, signed),
        (signed + 1, None),
    ]
    assert ring.entries[0].verifier == old_ring.entries[0].verifier
    assert json.loads(files.keyring.read_text()) == json.loads(rotated.stdout)
    assert files.key.stat().st_mode & 0o777 == 0o600
    services.ledger = restarted(services)  # a server started after the rotation
    note = logged(services, workspace, member, "L-3")  # waits for a covering checkpoint
    assert ring.open_checkpoint(note).size > signed
    with pytest.raises(NoteError):
        old_ring.open_checkpoint(note)  # signed by the new key only
    assert verify_ledger(services.app, services.database, ring, old_note).ok
    assert cli("audit", "keyring").stdout == rotated.stdout


def test_a_key_others_may_read_is_refused_at_start(services, cli):
    files = ledger_keys.key_files(services.settings)
    files.key.chmod(0o644)
    with pytest.raises(LedgerKeyUnsafe, match="chmod 600"):
        init_storage(services.settings)
    init = cli("db", "init")
    assert init.exit_code == 1 and "mode 0644" in init.output
    refused_to_sign(services, "mode 0644")


def test_an_unreadable_key_stops_signing_and_is_not_replaced(services, workspace, member):
    logged(services, workspace, member, "U-1")
    files = ledger_keys.key_files(services.settings)
    files.key.write_text("not a key\n")
    assert create_more(services, workspace, member, "U-2")
    refused_to_sign(services, "cannot be read")
    assert files.key.read_text() == "not a key\n"


def test_a_key_file_swapped_by_hand_does_not_sign(services, workspace, member):
    """Only a key the keyring lists for the size signs (``audit rotate-key``
    records it); a new key dropped in place of the old one would sign
    checkpoints no auditor's keyring accepts."""
    logged(services, workspace, member, "W-1")
    files = ledger_keys.key_files(services.settings)
    origin = parse_keyring(files.keyring.read_text()).origin
    files.key.unlink()
    ledger_keys.write_private(files.key, generate_signer(origin).skey() + "\n")
    assert create_more(services, workspace, member, "W-2")
    before = checkpoints(services)
    refused_to_sign(services, "has no window")
    assert checkpoints(services) == before
    # /readyz of a process that does not sequence (a web worker beside the
    # background process) says so too, from its own look
    assert "has no window" in (restarted(services).health() or "")


def test_an_upgraded_deployment_keeps_its_key_and_origin_and_anchors_once(
    services, workspace, member
):
    """A key dir from before keyrings and anchors were kept (the key alone):
    the next start writes the keyring for that key (its own origin stays) and
    anchors to the store's latest checkpoint, which its key verifies."""
    note = logged(services, workspace, member, "UP-1")
    files = ledger_keys.key_files(services.settings)
    signer = ledger.load_signer(services.settings)
    files.keyring.unlink()
    files.anchor.unlink()
    init_storage(services.settings)
    ring = parse_keyring(files.keyring.read_text())
    assert ring.origin == signer.name
    assert [(e.verifier, e.from_size, e.until_size) for e in ring.entries] == [
        (signer.verifier, 0, None)
    ]
    with services.database.transaction() as tx:
        latest = ledger.store.latest_checkpoint(tx)
    assert ledger_keys.read_anchor(files) == ring.open_checkpoint(latest[1])
    assert ring.open_checkpoint(latest[1]).size >= ring.open_checkpoint(note).size
    assert files.anchor.stat().st_mode & 0o777 == 0o600
