"""Issue 47, point 3, on both backends: a task forgotten between two
checkpoints leaves every checkpoint, inclusion proof and consistency proof
issued before it verifying byte for byte with the public keyring alone
(kandev-es-verify); a bundle issued after it carries the same event bytes and
verifies too; `audit verify --ledger` reports the task "forgotten, consistent";
and tampering with what remains of a forgotten event is still caught."""

from __future__ import annotations

import json

from kandev_es_client.verify import main as offline

from kandev_es.domain.external_id import identity_id
from tests.conftest import bearer
from tests.integration.tampering import TAMPERING
from tests.integration.test_ledger import logged, services_client

MARKER = "Zebra-Marker-4711"


def forget_between_checkpoints(cli, services, workspace, member, operator, tmp_path):
    client = services_client(services)
    made = client.post(
        "/api/v1/tasks", json={"external_id": "PROOF-1", "title": MARKER}, headers=bearer(member[1])
    ).json
    first = logged(services, workspace, member, "PROOF-0")
    (tmp_path / "first.txt").write_text(first)
    (tmp_path / "keyring.json").write_text(cli("audit", "keyring").stdout)
    before = cli(
        "identity", "history", "--workspace", "acme", "--external-id", "PROOF-1", "--proof"
    ).stdout
    (tmp_path / "before.json").write_text(before)
    forgot = client.post(
        f"/api/v1/tasks/{made['id']}/forget",
        json={"reason": "art. 17"},
        headers={**bearer(operator[1]), "Idempotency-Key": "erase-p"},
    )
    assert forgot.status_code == 200, forgot.json
    second = logged(services, workspace, member, "PROOF-2")
    (tmp_path / "second.txt").write_text(second)
    return made, first, second, json.loads(before)


def test_proofs_issued_before_a_forget_verify_after_it(
    cli, services, workspace, member, operator, tmp_path
):
    made, first, _second, before = forget_between_checkpoints(
        cli, services, workspace, member, operator, tmp_path
    )
    ring = ["--keyring", str(tmp_path / "keyring.json")]
    assert offline(["bundle", str(tmp_path / "before.json"), *ring]) == 0
    assert offline(["checkpoint", str(tmp_path / "first.txt"), *ring]) == 0
    after = cli(
        "identity",
        "history",
        "--workspace",
        "acme",
        "--external-id",
        "PROOF-1",
        "--proof",
        "--consistency-from",
        first.split("\n")[1],
    ).stdout  # the first checkpoint's size
    (tmp_path / "after.json").write_text(after)
    later = json.loads(after)
    assert later["events"][: len(before["events"])] == [
        {
            **e,
            "inclusion": later["events"][i]["inclusion"],
            "leaf_index": later["events"][i]["leaf_index"],
        }
        for i, e in enumerate(before["events"])
    ]  # the same events, byte for byte; only the proofs are against the newer tree
    assert [e["event"] for e in later["events"]][-1] == "Forgotten"
    assert MARKER not in after and MARKER not in json.dumps(before)
    held = ["--checkpoint", str(tmp_path / "first.txt")]
    assert offline(["bundle", str(tmp_path / "after.json"), *ring, *held]) == 0
    proof = cli("audit", "consistency", "--from", first.split("\n")[1]).stdout
    (tmp_path / "consistency.json").write_text(proof)
    assert offline(["consistency", str(tmp_path / "consistency.json"), *ring]) == 0

    for checkpoint in ("first.txt", "second.txt"):
        verified = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / checkpoint))
        assert verified.exit_code == 0, verified.output
        assert f"task {made['id']}: forgotten, consistent" in verified.stdout
        assert verified.stdout.splitlines()[-1] == "OK"


def test_tampering_with_a_forgotten_event_is_still_caught(
    cli, services, workspace, member, operator, tmp_path
):
    made, *_ = forget_between_checkpoints(cli, services, workspace, member, operator, tmp_path)
    stream = identity_id(workspace.id, "PROOF-1")
    version = TAMPERING["edit"](services, stream)  # version 2: the sealed Claimed
    failed = cli("audit", "verify", "--ledger", "--checkpoint", str(tmp_path / "first.txt"))
    assert failed.exit_code == 1
    assert f"stream {stream} version {version}: changed" in failed.stdout
    assert f"task {made['id']}: forgotten, INCONSISTENT" in failed.stdout
