"""C2SP signed notes and checkpoints with Ed25519, checked against the spec's
published example and the Go reference implementation's key and note
(tests/fixtures/merkle/signed-note-vectors.json names both), and the keyring's
validity windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kandev_es_client import signed_note as sn

VECTORS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "merkle" / "signed-note-vectors.json")
    .read_text(encoding="utf-8")
)
SPEC = VECTORS["c2sp_spec_example"]
GO = VECTORS["go_sumdb_note_example"]


def test_the_spec_example_verifies_with_its_verifier_key():
    verifier = sn.parse_vkey(SPEC["vkey"])
    assert verifier.vkey() == SPEC["vkey"]  # the key id is SHA-256(name || 0x0A || 0x01 || key)[:4]
    text, signers = sn.open_note(SPEC["note"], [verifier])
    assert (text, signers) == (SPEC["text"], [verifier])


def test_signing_reproduces_the_reference_note_byte_for_byte():
    signer = sn.parse_skey(GO["skey"])
    assert signer.skey() == GO["skey"]
    assert signer.verifier.vkey() == GO["vkey"]
    assert sn.sign_note(GO["text"], signer) == GO["note"]


def test_a_changed_text_or_signature_is_refused_and_unknown_keys_are_ignored():
    verifier = sn.parse_vkey(GO["vkey"])
    with pytest.raises(sn.NoteError, match="does not verify"):
        sn.open_note(GO["note"].replace("answer", "Answer"), [verifier])
    stranger = sn.generate_signer("PeterNeumann").verifier  # same name, other key id
    with pytest.raises(sn.NoteError, match="no signature from a known key"):
        sn.open_note(GO["note"], [stranger])
    for bad in ("no blank line\n", GO["note"].replace("\u2014", "-"), GO["note"][:-1]):
        with pytest.raises(sn.NoteError):
            sn.open_note(bad, [verifier])


def test_a_checkpoint_round_trips_and_the_keyring_honours_each_keys_window():
    old, new = sn.generate_signer("log.example/kandev"), sn.generate_signer("log.example/kandev")
    keyring = sn.parse_keyring(sn.Keyring([
        sn.KeyringEntry(old.verifier, 0, 100), sn.KeyringEntry(new.verifier, 101, None),
    ]).to_json())
    early = sn.Checkpoint("log.example/kandev", 100, bytes(range(32)))
    assert keyring.open_checkpoint(sn.sign_note(early.text(), old)) == early
    late = sn.Checkpoint("log.example/kandev", 101, bytes(32))
    assert keyring.open_checkpoint(sn.sign_note(late.text(), new), "log.example/kandev") == late
    with pytest.raises(sn.NoteError, match="size 101: no signature from a known key"):
        keyring.open_checkpoint(sn.sign_note(late.text(), old))  # a retired key
    with pytest.raises(sn.NoteError, match="origin"):
        keyring.open_checkpoint(sn.sign_note(late.text(), new), "elsewhere")
    with pytest.raises(sn.NoteError, match="leading zeroes"):
        sn.parse_checkpoint("log.example/kandev\n0101\nAAAA\n")
