"""Witnesses on both backends (docs/auditing.md, "Witnesses"): a real witness
process (``kandev-es-verify witness serve``, its own key and state file) is
asked by the sequencer to cosign every checkpoint it signs; the offline
verifier then requires k of n witness cosignatures; and a split view — the
log's own key signing another history — gets none, so it fails there."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid

import pytest
from kandev_es_client import merkle, witness
from kandev_es_client import signed_note as sn
from kandev_es_client.verify import main as offline

from kandev_es.services import ledger
from tests.integration.test_ledger import keyring, logged

WITNESS = "witness.test/w1"


@pytest.fixture
def witness_url(services, tmp_path):
    """A witness process trusting this test's log: (its URL, its vkey, state file)."""
    key = tmp_path / "witness.key"
    made = subprocess.run([sys.executable, "-m", "kandev_es_client.verify", "witness", "keygen",
                           WITNESS, "--key", str(key)], capture_output=True, text=True,
                          check=True)
    vkey = made.stdout.strip()
    (tmp_path / "log.json").write_text(keyring(services).to_json())
    state = tmp_path / "witness-state.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "kandev_es_client.verify", "witness", "serve", "--key", str(key),
         "--state", str(state), "--log", str(tmp_path / "log.json"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith(f"witness {WITNESS} on http://"), first
        yield first.split(" on ")[1].split(" ")[0], vkey, state
    finally:
        process.terminate()
        process.wait(timeout=10)


def sequencer(services, *urls):
    return ledger.Sequencer(services.app, services.database, dataclasses.replace(
        services.settings, ledger_witness_urls=tuple(urls)))


def test_checkpoints_are_cosigned_and_the_verifier_requires_k_of_n(
    services, workspace, member, witness_url, tmp_path
):
    url, vkey, state = witness_url
    signer = sequencer(services, url)
    services.ledger = signer
    logged(services, workspace, member, "WIT-1")
    signed = logged(services, workspace, member, "WIT-2")  # the second: a consistency proof
    key = witness.parse_cosigner_vkey(vkey)
    note = ledger.latest_checkpoint(services.database)  # as stored and served after
    assert note.startswith(signed) and WITNESS in witness.cosigners_of(note, [key])
    size = keyring(services).open_checkpoint(note).size
    assert json.loads(state.read_text())["logs"][keyring(services).entries[0].verifier.name][
        "size"] == size

    bundle = ledger.proof_bundle(services.app, services.database, workspace.id, "WIT-2")
    (tmp_path / "bundle.json").write_text(json.dumps(bundle))
    (tmp_path / "keyring.json").write_text(keyring(services).to_json())
    base = ["bundle", str(tmp_path / "bundle.json"), "--keyring", str(tmp_path / "keyring.json")]
    assert offline([*base, "--witness-key", vkey]) == 0
    other = witness.generate_cosigner("witness.test/w2").key.vkey()
    assert offline([*base, "--witness-key", vkey, "--witness-key", other,
                    "--witnesses-required", "1"]) == 0
    assert offline([*base, "--witness-key", vkey, "--witness-key", other]) == 1


def test_a_split_view_is_refused_by_the_witness_and_fails_the_verifier(
    services, workspace, member, witness_url, tmp_path, capsys
):
    """The log's key signs a second history of the same size (what a split
    view shows another auditor): the witness, having cosigned the first,
    answers 409, so the forged checkpoint carries no cosignature."""
    import httpx

    url, vkey, _ = witness_url
    services.ledger = sequencer(services, url)
    note = logged(services, workspace, member, "SPLIT-1")
    real = keyring(services).open_checkpoint(note)
    signer = ledger.load_signer(services.settings)
    tree = merkle.MemoryTree()
    for _ in range(real.size):
        tree.append(uuid.uuid4().bytes * 2)
    forged = sn.sign_note(sn.Checkpoint(real.origin, real.size, tree.root()).text(), signer)
    answer = httpx.post(f"{url}/add-checkpoint",
                        content=witness.add_checkpoint_body(real.size, [], forged))
    assert (answer.status_code, answer.text) == (409, f"{real.size}\n")
    assert answer.headers["content-type"] == witness.SIZE_TYPE
    (tmp_path / "forged.txt").write_text(forged)
    (tmp_path / "keyring.json").write_text(keyring(services).to_json())
    args = ["checkpoint", str(tmp_path / "forged.txt"), "--keyring",
            str(tmp_path / "keyring.json"), "--witness-key", vkey]
    capsys.readouterr()
    assert offline(args) == 1
    assert "witnesses: 0 of 1 cosigned this checkpoint (none): FAILED" in capsys.readouterr().out
    (tmp_path / "real.txt").write_text(ledger.latest_checkpoint(services.database))
    assert offline([*args[:1], str(tmp_path / "real.txt"), *args[2:]]) == 0


def test_a_witness_that_is_down_does_not_stop_signing(services, workspace, member, caplog):
    services.ledger = sequencer(services, "http://127.0.0.1:9")  # nothing listens there
    note = logged(services, workspace, member, "DOWN-1")
    assert len(sn.split_note(note)[1]) == 1  # the log's own signature only
    assert "did not cosign the checkpoint" in caplog.text
