"""The offline verifier's checks of a proof bundle (kandev_es_client.ledger and the
``kandev-es-verify`` command): an intact bundle verifies; a changed event, a
missing one, a forged inclusion proof and a foreign key each fail, naming the
event and the reason."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from kandev_es_client import heads, ledger, merkle, verify
from kandev_es_client import signed_note as sn

ORIGIN = "ledger.test/kandev-es"
WORKSPACE = uuid.UUID("00000000-0000-4000-8000-0000000000aa")
EXTERNAL_ID = "JIRA-7"
STREAM = ledger.identity_stream(str(WORKSPACE), EXTERNAL_ID)
REGISTERED = json.dumps(
    {"workspace_id": {"_type_": "uuid_hex", "_data_": WORKSPACE.hex}, "external_id": EXTERNAL_ID}
).encode()
EVENTS = [
    (1, "kandev_es.domain.identity:Identity.Registered", REGISTERED),
    (2, "kandev_es.domain.identity:Identity.Claimed", b'{"b":2}'),
    (3, "kandev_es.domain.identity:Identity.Completed", b'{"c":3}'),
]
LEAVES = (1, 4, 8)  # the stream's events' leaves in a log of 12


class Log:
    """A log of 12 leaves where the stream's events are leaves 1, 4 and 8,
    its signer, and signed checkpoints of any size."""

    def __init__(self) -> None:
        self.signer = sn.generate_signer(ORIGIN)
        self.keyring = sn.Keyring([sn.KeyringEntry(self.signer.verifier)])
        self.tree = merkle.MemoryTree()
        hashes, others = ledger.chain(STREAM, EVENTS), iter(bytes([i]) * 32 for i in range(12))
        for index in range(12):
            self.tree.append(hashes[LEAVES.index(index)] if index in LEAVES else next(others))
        self.hashes = hashes

    def map_at(self, size: int) -> dict[uuid.UUID, heads.Head]:
        """Each stream's head among the first ``size`` leaves (the other
        leaves are one-event streams of their own)."""
        found = {}
        for index in range(size):
            if index in LEAVES:
                version = LEAVES.index(index) + 1
                found[STREAM] = heads.Head(STREAM, version, self.hashes[version - 1])
            else:
                other = uuid.UUID(int=index + 1)
                found[other] = heads.Head(other, 1, self.tree.nodes[(0, index)])
        return found

    def note(self, size: int, with_map: bool = True) -> str:
        lines = (heads.extension_line(heads.memory_root(self.map_at(size).values())),)
        checkpoint = sn.Checkpoint(ORIGIN, size, self.tree.root(size), lines if with_map else ())
        return sn.sign_note(checkpoint.text(), self.signer)

    def heads_proof(self, size: int) -> dict:
        entries = list(self.map_at(size).values())
        bucket = heads.bucket_of(STREAM)
        nodes = heads.updated_nodes(
            lambda level, index: None,
            {
                b: heads.bucket_hash(e for e in entries if heads.bucket_of(e.stream) == b)
                for b in {heads.bucket_of(e.stream) for e in entries}
            },
        )
        mine = sorted(
            (e for e in entries if heads.bucket_of(e.stream) == bucket),
            key=lambda e: e.stream.bytes,
        )
        path = [nodes.get(key, heads.EMPTY[key[0]]) for key in heads.siblings(bucket)]
        return heads.proof_document(mine, path)

    def held(self, size: int) -> sn.Checkpoint:
        return self.keyring.open_checkpoint(self.note(size))

    def bundle(
        self, size: int = 8, consistency_from: tuple[int, ...] = (), with_map: bool = True
    ) -> dict:
        b64 = base64.b64encode
        return {
            "format": ledger.BUNDLE_FORMAT,
            "stream_id": str(STREAM),
            "workspace_id": str(WORKSPACE),
            "external_id": EXTERNAL_ID,
            "checkpoint": self.note(size, with_map),
            "events": [
                {
                    "version": v,
                    "topic": t,
                    "state": b64(s).decode(),
                    "hash": b64(h).decode(),
                    "leaf_index": LEAVES[i],
                    "inclusion": [
                        b64(p).decode()
                        for p in merkle.inclusion_proof(self.tree.node, LEAVES[i], size)
                    ]
                    if LEAVES[i] < size
                    else [],
                }
                for i, ((v, t, s), h) in enumerate(zip(EVENTS, self.hashes, strict=True))
            ],
            "consistency": [
                {
                    "from_size": old,
                    "proof": [
                        b64(p).decode() for p in merkle.consistency_proof(self.tree.node, old, size)
                    ],
                }
                for old in consistency_from
            ],
            "heads": self.heads_proof(size),
        }


def signed_log():
    """A bundle against a checkpoint at size 8 (so the last event is written
    after it), and the keyring."""
    log = Log()
    return log.bundle(8), log.keyring


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
    assert (
        verify.main(
            [
                "checkpoint",
                str(tmp_path / "checkpoint"),
                "--keyring",
                str(tmp_path / "keyring.json"),
            ]
        )
        == 0
    )
    assert (
        verify.main(
            ["bundle", str(tmp_path / "missing"), "--keyring", str(tmp_path / "keyring.json")]
        )
        == verify.USAGE_ERROR
    )


def forged_completed(bundle, leaf_index):
    """The Completed (v3) replaced by other bytes, its chain hash recomputed,
    and marked pending the way a bundle can: no leaf or one beyond its tree."""
    forged = [(v, t, b'{"forged":1}' if v == 3 else s) for v, t, s in EVENTS]
    item = bundle["events"][2]
    item["state"] = base64.b64encode(forged[2][2]).decode()
    item["hash"] = base64.b64encode(ledger.chain(STREAM, forged)[2]).decode()
    item["leaf_index"], item["inclusion"] = leaf_index, []
    return bundle


def test_the_auditors_checkpoint_must_be_extended_by_the_bundles():
    log = Log()
    report = ledger.verify_bundle(
        log.bundle(12, (5, 9)), log.keyring, ORIGIN, [log.held(5), log.held(9), log.held(12)]
    )
    assert report.ok, report.lines()
    assert statuses(report) == [(1, "verified"), (2, "verified"), (3, "verified")]
    extends = "your checkpoint of size 9: the bundle's checkpoint extends it: OK"
    assert extends in report.lines()[1:4][1]

    missing = ledger.verify_bundle(log.bundle(12), log.keyring, ORIGIN, [log.held(5)])
    assert not missing.ok
    assert "no consistency proof from size 5" in missing.lines()[1]
    assert "--consistency-from 5" in missing.lines()[1]
    wrong = log.bundle(12, (5,))
    wrong["consistency"][0]["proof"] = list(reversed(wrong["consistency"][0]["proof"]))
    assert not ledger.verify_bundle(wrong, log.keyring, ORIGIN, [log.held(5)]).ok


def test_the_auditors_empty_first_checkpoint_is_extended_by_every_bundle():
    """A log's first checkpoint may be of size 0 (db init on an empty store):
    every tree extends the empty one, so it needs no proof (the server makes
    none from 0, and the verifier failed every bundle for lack of one); one
    of size 0 whose root is not the empty tree's still fails."""
    log = Log()
    assert log.held(0).root == merkle.EMPTY_ROOT
    report = ledger.verify_bundle(log.bundle(12), log.keyring, ORIGIN, [log.held(0)])
    assert report.ok, report.lines()
    assert "your checkpoint of size 0: the bundle's checkpoint extends it" in report.lines()[1]
    lying = sn.Checkpoint(ORIGIN, 0, bytes(32)).text()
    forged = log.keyring.open_checkpoint(sn.sign_note(lying, log.signer))
    assert not ledger.verify_bundle(log.bundle(12), log.keyring, ORIGIN, [forged]).ok


def test_a_replaced_event_marked_pending_fails_against_the_auditors_checkpoint():
    """The attack of issue 43: the server hands out a bundle against an old
    checkpoint (size 8) in which the replaced Completed (leaf 8) passes as
    pending; the auditor's own checkpoint (size 10) covers leaf 8."""
    log = Log()
    forged = forged_completed(log.bundle(8), None)
    alone = ledger.verify_bundle(forged, log.keyring, ORIGIN)
    assert alone.ok and statuses(alone)[2] == (3, "pending")  # what the bundle alone shows
    report = ledger.verify_bundle(forged, log.keyring, ORIGIN, [log.held(10)])
    assert not report.ok
    assert "is older than yours" in "\n".join(report.lines())
    # A bundle against the auditor's size must prove leaf 8: pending is no way out.
    forged = forged_completed(log.bundle(10), 8)
    report = ledger.verify_bundle(forged, log.keyring, ORIGIN, [log.held(10)])
    assert statuses(report)[2] == (3, "failed"), report.lines()
    assert "not in the log at leaf 8" in report.findings[2].problem


def test_an_earlier_event_pending_while_a_later_one_is_logged_fails():
    log = Log()
    bundle = log.bundle(12, with_map=False)  # the order alone, without the map's check
    bundle["events"][1]["leaf_index"], bundle["events"][1]["inclusion"] = None, []
    report = ledger.verify_bundle(bundle, log.keyring, ORIGIN)
    assert statuses(report) == [(1, "verified"), (2, "pending"), (3, "failed")]
    assert "an earlier event is marked pending" in report.findings[2].problem


def test_another_history_of_the_same_size_fails():
    log = Log()
    fork = sn.Checkpoint(ORIGIN, 12, bytes(32))  # what the auditor was shown
    report = ledger.verify_bundle(log.bundle(12), log.keyring, ORIGIN, [fork])
    assert not report.ok
    assert "two different histories" in report.lines()[1]


def test_the_labels_must_name_the_stream_and_its_registered_event():
    log = Log()
    for field, value, said in (
        ("external_id", "JIRA-8", "whose stream is"),
        ("workspace_id", str(uuid.UUID(int=5)), "whose stream is"),
        ("workspace_id", "not-a-uuid", "is not a UUID"),
        ("external_id", None, "does not say which workspace"),
    ):
        bundle = log.bundle(12)
        bundle[field] = value
        report = ledger.verify_bundle(bundle, log.keyring)
        assert not report.ok and said in report.problem, (field, report.problem)
    # A stream id that matches the labels but whose Registered records another identity.
    bundle = log.bundle(12)
    bundle["external_id"] = "JIRA-9"
    bundle["stream_id"] = str(ledger.identity_stream(str(WORKSPACE), "JIRA-9"))
    report = ledger.verify_bundle(bundle, log.keyring)
    assert "its v1 records workspace" in report.problem
    assert f"external ID '{EXTERNAL_ID}'" in report.problem


@pytest.mark.parametrize(
    "value, said",
    [
        ("4", '"4", not a whole number'),
        (4.5, "4.5, not a whole number"),
        (True, "true, not a whole number"),
        (-1, "-1 is out of range"),
        (2**64, "is out of range"),
        ([4], "not a whole number"),
    ],
)
def test_a_leaf_index_that_is_not_a_whole_number_in_range_is_refused(value, said):
    log = Log()
    bundle = log.bundle(12)
    bundle["events"][1]["leaf_index"] = value
    report = ledger.verify_bundle(bundle, log.keyring)
    assert not report.ok
    assert report.problem.startswith("malformed event: v2's leaf index") and said in report.problem


def run(tmp_path, capsys, text, *extra, log=None):
    log = log or Log()
    (tmp_path / "keyring.json").write_text(log.keyring.to_json())
    (tmp_path / "input.json").write_text(text)
    code = verify.main(
        [
            "bundle",
            str(tmp_path / "input.json"),
            "--keyring",
            str(tmp_path / "keyring.json"),
            *extra,
        ]
    )
    return code, capsys.readouterr()


@pytest.mark.parametrize(
    "text, said",
    [
        ("", "is empty: expected a proof bundle"),
        ("  \n", "is empty: expected a proof bundle"),
        ("<html>502 Bad Gateway</html>", "is not JSON (line 1, column 1): expected a proof bundle"),
        (
            '{"format": "kandev-es/proof-bundle/v1", "events": [{"leaf_index": Infinity}]}',
            "it holds Infinity, which is not a number JSON allows",
        ),
        ("[1, 2]", "it is not a JSON object"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_the_verifier_says_in_words_what_a_file_is_instead_of_a_bundle(
    tmp_path, capsys, text, said
):
    code, out = run(tmp_path, capsys, text)
    assert code == verify.USAGE_ERROR
    assert out.out == "" and said in out.err and "Traceback" not in out.err, out
    assert "Expecting value" not in out.err


def test_the_verifier_command_takes_the_auditors_checkpoints(tmp_path, capsys):
    log = Log()
    for size in (5, 10):
        (tmp_path / f"mine-{size}.txt").write_text(log.note(size))
    held = [
        "--checkpoint",
        str(tmp_path / "mine-5.txt"),
        "--checkpoint",
        str(tmp_path / "mine-10.txt"),
    ]
    code, out = run(tmp_path, capsys, json.dumps(log.bundle(12, (5, 10))), *held, log=log)
    assert code == 0, out.out
    assert out.out.count("the bundle's checkpoint extends it: OK") == 2
    code, out = run(
        tmp_path, capsys, json.dumps(forged_completed(log.bundle(8), None)), *held, log=log
    )
    assert code == 1 and "is older than yours" in out.out
    (tmp_path / "empty.txt").write_text("")
    code, out = run(
        tmp_path,
        capsys,
        json.dumps(log.bundle(12)),
        "--checkpoint",
        str(tmp_path / "empty.txt"),
        log=log,
    )
    assert code == verify.USAGE_ERROR and "your checkpoint" in out.err and "is empty" in out.err


def test_the_checkpoints_map_of_stream_heads_proves_the_bundle_whole():
    log = Log()
    report = ledger.verify_bundle(log.bundle(12), log.keyring, ORIGIN)
    assert report.ok, report.lines()
    assert "complete: the checkpoint commits the stream's head as v3" in report.lines()[1]
    early = ledger.verify_bundle(log.bundle(8), log.keyring, ORIGIN)  # v3 after it: pending
    assert early.ok and statuses(early)[2] == (3, "pending"), early.lines()
    assert "head as v2" in early.completeness


def test_a_bundle_without_the_streams_last_event_fails():
    """Issue 43: deleting an identity's Completed left its bundle saying OK."""
    log = Log()
    bundle = log.bundle(12)
    del bundle["events"][2]
    report = ledger.verify_bundle(bundle, log.keyring, ORIGIN)
    assert not report.ok
    assert report.problem == (
        "1 event(s) missing: the checkpoint commits the stream's head as v3, the bundle ends at v2"
    )


@pytest.mark.parametrize("leaf_index", [None, 20])
def test_a_replaced_event_marked_pending_fails_against_the_map(leaf_index):
    """The forged bundle of issue 43 against the latest checkpoint itself: no
    leaf (or one beyond the tree) no longer makes an event pending."""
    log = Log()
    report = ledger.verify_bundle(forged_completed(log.bundle(12), leaf_index), log.keyring)
    assert statuses(report) == [(1, "verified"), (2, "verified"), (3, "failed")]
    covered = "the checkpoint covers it (the stream's head there is v3), yet it is pending"
    assert report.findings[2].problem == covered


def test_a_forged_map_proof_fails():
    log = Log()
    bundle = log.bundle(12)
    bundle["heads"]["entries"][0][1] = 2  # the stream's head said to be v2
    report = ledger.verify_bundle(bundle, log.keyring)
    assert report.problem == (
        "stream heads: the stream-heads proof does not lead to the checkpoint's map root"
    )
    bundle = log.bundle(12)
    bundle["heads"]["entries"] = []  # the stream said not to be in the map
    assert "does not lead" in ledger.verify_bundle(bundle, log.keyring).problem
    bundle = log.bundle(12)
    del bundle["heads"]
    assert ledger.verify_bundle(bundle, log.keyring).problem == (
        "stream heads: the bundle carries no stream-heads proof"
    )


def test_a_checkpoint_without_a_map_says_completeness_is_not_proven():
    log = Log()
    report = ledger.verify_bundle(log.bundle(12, with_map=False), log.keyring)
    assert report.ok
    assert "completeness not proven" in report.completeness
