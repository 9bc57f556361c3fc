"""The offline verifier's checks of a proof bundle (kandev_es_client.ledger and the
``kandev-es-verify`` command): an intact bundle verifies; a changed event, a
missing one, a forged inclusion proof and a foreign key each fail, naming the
event and the reason."""

from __future__ import annotations

import base64
import json
import uuid

from kandev_es_client import ledger, merkle, verify
from kandev_es_client import signed_note as sn

ORIGIN = "ledger.test/kandev-es"
STREAM = uuid.UUID("00000000-0000-4000-8000-000000000001")
EVENTS = [(1, "kandev_es.domain.identity:Identity.Registered", b'{"a":1}'),
          (2, "kandev_es.domain.identity:Identity.Claimed", b'{"b":2}'),
          (3, "kandev_es.domain.identity:Identity.Completed", b'{"c":3}')]


def signed_log():
    """A log of 9 leaves where the stream's events are leaves 1, 4 and 8, and
    a checkpoint at size 8 (so the last event is written after it)."""
    signer = sn.generate_signer(ORIGIN)
    tree, hashes, indexes = merkle.MemoryTree(), ledger.chain(STREAM, EVENTS), {}
    others = iter(bytes([i]) * 32 for i in range(10))
    for index in range(9):
        if index in (1, 4, 8):
            indexes[len(indexes)] = index
            tree.append(hashes[len(indexes) - 1])
        else:
            tree.append(next(others))
    checkpoint = sn.Checkpoint(ORIGIN, 8, tree.root(8))
    bundle = {
        "format": ledger.BUNDLE_FORMAT, "stream_id": str(STREAM),
        "checkpoint": sn.sign_note(checkpoint.text(), signer),
        "events": [
            {"version": v, "topic": t, "state": base64.b64encode(s).decode(),
             "hash": base64.b64encode(h).decode(), "leaf_index": indexes[i],
             "inclusion": [base64.b64encode(p).decode()
                           for p in merkle.inclusion_proof(tree.node, indexes[i], 8)]
             if indexes[i] < 8 else []}
            for i, ((v, t, s), h) in enumerate(zip(EVENTS, hashes, strict=True))
        ],
    }
    return bundle, sn.Keyring([sn.KeyringEntry(signer.verifier)])


def statuses(report):
    return [(f.version, f.status) for f in report.findings]


def test_an_intact_bundle_verifies_up_to_its_checkpoint():
    bundle, keyring = signed_log()
    report = ledger.verify_bundle(bundle, keyring, ORIGIN)
    assert report.ok, report.lines()
    assert statuses(report) == [(1, "verified"), (2, "verified"), (3, "pending")]


def test_a_changed_event_is_named_with_its_version():
    bundle, keyring = signed_log()
    bundle["events"][1]["state"] = base64.b64encode(b'{"b":3}').decode()
    report = ledger.verify_bundle(bundle, keyring)
    assert not report.ok
    assert statuses(report) == [(1, "verified"), (2, "failed"), (3, "pending")]
    assert "chain hash does not match" in report.findings[1].problem


def test_a_recomputed_chain_is_still_caught_by_the_tree():
    bundle, keyring = signed_log()
    forged = [(v, t, b"forged" if v == 2 else s) for v, t, s in EVENTS]
    for item, value in zip(bundle["events"], ledger.chain(STREAM, forged), strict=True):
        state = {v: s for v, _, s in forged}[item["version"]]
        item["state"] = base64.b64encode(state).decode()
        item["hash"] = base64.b64encode(value).decode()
    report = ledger.verify_bundle(bundle, keyring)
    assert statuses(report)[:2] == [(1, "verified"), (2, "failed")]
    assert "not in the log at leaf 4" in report.findings[1].problem


def test_a_missing_event_and_a_foreign_key_fail():
    bundle, keyring = signed_log()
    del bundle["events"][0]
    report = ledger.verify_bundle(bundle, keyring)
    assert report.findings[0].problem.startswith("expected version 1")
    other = sn.Keyring([sn.KeyringEntry(sn.generate_signer(ORIGIN).verifier)])
    assert "no signature from a known key" in ledger.verify_bundle(signed_log()[0], other).problem


def test_the_verifier_command_reads_files_and_exits_by_outcome(tmp_path, capsys):
    bundle, keyring = signed_log()
    (tmp_path / "keyring.json").write_text(keyring.to_json())
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    args = ["bundle", str(tmp_path / "bundle.json"), "--keyring", str(tmp_path / "keyring.json")]
    assert verify.main(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "OK"
    bundle["events"][0]["version"] = 2
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    assert verify.main(args) == 1
    assert "v2 Registered: failed: expected version 1" in capsys.readouterr().out
    (tmp_path / "checkpoint").write_text(bundle["checkpoint"])
    assert verify.main(["checkpoint", str(tmp_path / "checkpoint"),
                        "--keyring", str(tmp_path / "keyring.json")]) == 0
    assert verify.main(["bundle", str(tmp_path / "missing"), "--keyring",
                        str(tmp_path / "keyring.json")]) == verify.USAGE_ERROR
