"""The witness (kandev_es_client.witness, c2sp.org/tlog-witness and
tlog-cosignature): cosignature/v1 lines that verify with the witness's key
only, and the add-checkpoint rules — it cosigns a checkpoint only when the
log's key signed it and it extends the last one it cosigned, keeping that in
its own state file, and answers every other case with the spec's status."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kandev_es_client import merkle, witness
from kandev_es_client import signed_note as sn

from kandev_es.services import ledger_witness

ORIGIN = "witness.test/log"


class Log:
    def __init__(self, leaves: int = 20, salt: bytes = b"") -> None:
        self.signer = sn.generate_signer(ORIGIN)
        self.keyring = sn.Keyring([sn.KeyringEntry(self.signer.verifier)])
        self.tree = merkle.MemoryTree()
        for i in range(leaves):
            self.tree.append(hashlib.sha256(salt + bytes([i])).digest())

    def note(self, size: int, signer: sn.Signer | None = None) -> str:
        text = sn.Checkpoint(ORIGIN, size, self.tree.root(size), ("ext line",)).text()
        return sn.sign_note(text, signer or self.signer)

    def body(self, old: int, size: int, proof: list[bytes] | None = None) -> str:
        if proof is None:
            proof = merkle.consistency_proof(self.tree.node, old, size) if 0 < old < size else []
        return witness.add_checkpoint_body(old, proof, self.note(size))


def make_witness(tmp_path, log: Log) -> witness.Witness:
    cosigner = witness.generate_cosigner("witness.test/w1")
    return witness.Witness(
        cosigner, tmp_path / "state.json", [witness.TrustedLog(ORIGIN, log.keyring)]
    )


def refused(call) -> witness.Refused:
    with pytest.raises(witness.Refused) as caught:
        call()
    return caught.value


def test_a_cosignature_verifies_with_the_witness_key_over_the_whole_checkpoint():
    cosigner = witness.generate_cosigner("witness.test/w1")
    key = witness.parse_cosigner_vkey(cosigner.key.vkey())
    assert key == cosigner.key
    assert witness.parse_cosigner_skey(cosigner.skey()) == cosigner
    # The key id is over type 0x04 (a cosigner), not 0x01 (a note signer).
    assert key.key_id == hashlib.sha256(b"witness.test/w1\n\x04" + key.public_key).digest()[:4]
    assert key.key_id != sn.key_id("witness.test/w1", key.public_key)
    log = Log()
    note = log.note(5)
    line = cosigner.cosign(sn.split_note(note)[0], timestamp=1_700_000_000)
    blob = base64.b64decode(line.split(" ")[2])
    assert len(blob) == 4 + 8 + 64 and int.from_bytes(blob[4:12], "big") == 1_700_000_000
    assert witness.cosigners_of(note + line, [key]) == {"witness.test/w1": 1_700_000_000}
    other = witness.generate_cosigner("witness.test/w1").key
    assert witness.cosigners_of(note + line, [other]) == {}
    changed = note.replace("ext line", "ext lime")  # the extension line is signed too
    assert witness.cosigners_of(changed + line, [key]) == {}


def test_the_witness_cosigns_only_consistent_extensions_and_keeps_its_state(tmp_path):
    log = Log()
    first = make_witness(tmp_path, log)
    line = first.add_checkpoint(log.body(0, 5))
    assert witness.cosigners_of(log.note(5) + line, [first.cosigner.key])
    assert json.loads((tmp_path / "state.json").read_text())["logs"][ORIGIN]["size"] == 5
    again = witness.Witness(first.cosigner, tmp_path / "state.json", list(first.logs.values()))
    stale = refused(lambda: again.add_checkpoint(log.body(0, 9)))
    assert (stale.status, stale.message, stale.content_type) == (409, "5\n", witness.SIZE_TYPE)
    again.add_checkpoint(log.body(5, 9))
    again.add_checkpoint(log.body(9, 9))  # the same checkpoint again: cosigned again
    assert again.last(ORIGIN)[0] == 9


def test_a_split_view_gets_no_cosignature(tmp_path):
    """The log's key signs two histories: the witness cosigns the one it saw
    first and refuses the other, at the same size or a larger one."""
    log = Log()
    w = make_witness(tmp_path, log)
    w.add_checkpoint(log.body(0, 9))
    fork = Log(salt=b"fork")
    fork.signer, fork.keyring = log.signer, log.keyring
    same = refused(lambda: w.add_checkpoint(fork.body(9, 9)))
    assert (same.status, same.message) == (409, "9\n")
    larger = refused(lambda: w.add_checkpoint(fork.body(9, 12)))
    assert larger.status == 422 and "not consistent with size 9" in larger.message
    assert w.last(ORIGIN) == (9, log.tree.root(9))


@pytest.mark.parametrize(
    "make_body, status",
    [
        (lambda log: log.body(0, 5).replace(ORIGIN, "other.test/log"), 404),
        (
            lambda log: witness.add_checkpoint_body(0, [], log.note(5, sn.generate_signer(ORIGIN))),
            403,
        ),
        (lambda log: log.body(7, 5, []), 400),
        (lambda log: log.body(0, 5)[4:], 400),
        (lambda log: log.body(0, 5, [bytes(32)] * 64), 400),
        (lambda log: log.body(0, 5, [bytes(32)]), 422),
        (lambda log: "old 0\n\nnot a note\n", 400),
    ],
)
def test_each_bad_request_gets_its_status(tmp_path, make_body, status):
    log = Log()
    w = make_witness(tmp_path, log)
    assert refused(lambda: w.add_checkpoint(make_body(log))).status == status
    assert not (tmp_path / "state.json").exists()  # nothing recorded


def test_a_witness_that_cosigned_the_empty_tree_cosigns_its_extensions(tmp_path):
    """A new log's first checkpoint may be of size 0 (db init, or serve
    before any event): every tree extends it, so the next one comes with
    old 0 and no proof and is cosigned (it was refused 422 for ever)."""
    log = Log()
    w = make_witness(tmp_path, log)
    w.add_checkpoint(log.body(0, 0))
    assert w.last(ORIGIN) == (0, merkle.EMPTY_ROOT)
    line = w.add_checkpoint(log.body(0, 5))
    assert witness.cosigners_of(log.note(5) + line, [w.cosigner.key])
    assert w.last(ORIGIN)[0] == 5
    assert refused(lambda: w.add_checkpoint(log.body(5, 9, []))).status == 422
    (tmp_path / "fresh").mkdir()
    fresh = make_witness(tmp_path / "fresh", log)
    fresh.add_checkpoint(log.body(0, 0))
    assert refused(lambda: fresh.add_checkpoint(log.body(0, 5, [bytes(32)]))).status == 422


def test_a_content_length_of_non_ascii_digits_is_a_400(tmp_path):
    """'Content-Length: ²' (str.isdigit says yes, int() refuses) is answered
    400; it raised in the handler and the connection closed with no answer."""
    w = make_witness(tmp_path, Log())
    server = ThreadingHTTPServer(("127.0.0.1", 0), witness._handler(w))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as conn:
            conn.sendall(
                b"POST /add-checkpoint HTTP/1.1\r\nHost: w\r\n"
                b"Content-Length: \xb2\r\nConnection: close\r\n\r\n"
            )
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 400 "), answer[:80]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("answer", ["log", "two lines"])
def test_the_log_keeps_no_witness_answer_but_one_cosignature_line_of_its_own_name(tmp_path, answer):
    """A witness answering 200 with a line named as the log's key (its key id,
    a bad signature) would have every verifier refuse the stored checkpoint
    (a known key's failing signature rejects a note): such an answer, and
    two lines, are refused and the note kept as signed."""
    log = Log()
    note = log.note(5)
    cosigner = witness.generate_cosigner("witness.test/w1")
    forged = (
        f"{sn.EM_DASH} {ORIGIN} "
        f"{base64.b64encode(log.signer.verifier.key_id + bytes(64)).decode()}\n"
    )
    good = cosigner.cosign(sn.split_note(note)[0])
    body = {"log": forged, "two lines": good + good}[answer].encode()

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        asked = ledger_witness.Witnesses([f"http://127.0.0.1:{server.server_port}"])
        assert asked.cosign(note, 5, lambda old: []) == note
        assert log.keyring.open_checkpoint(note).size == 5
        with pytest.raises(sn.NoteError):
            log.keyring.open_checkpoint(note + forged)  # what was stored before
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_witness_answering_for_ever_is_cut_off_within_its_time(tmp_path):
    """A witness that answers 200 and then sends bytes for ever, each well
    within the read timeout, is given up on within about TIMEOUT_SECONDS and
    its answer kept to MAX_ANSWER bytes: it held the sequencer (so all
    signing) and its memory for as long as it kept sending."""
    log = Log()
    note = log.note(5)
    stop = threading.Event()

    class Endless(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    self.wfile.write(b"40\r\n" + b"x" * 64 + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.05)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    asked = ledger_witness.Witnesses([f"http://127.0.0.1:{server.server_port}"])
    answered: list[str] = []
    caller = threading.Thread(
        target=lambda: answered.append(asked.cosign(note, 5, lambda o: [])), daemon=True
    )
    try:
        started = time.monotonic()
        caller.start()
        caller.join(ledger_witness.TIMEOUT_SECONDS + 4)
        assert not caller.is_alive(), "still reading the witness's endless answer"
        assert answered == [note]
        assert time.monotonic() - started < ledger_witness.TIMEOUT_SECONDS + 3
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "sent", [b"", b"POST /add-checkpoint HTTP/1.1\r\nContent-Length: 10\r\n\r\nold"]
)
def test_a_connection_that_sends_nothing_more_is_closed_within_the_request_time(
    tmp_path, monkeypatch, sent
):
    """Each connection is a thread of the witness: one left open with nothing
    sent, or with a body that never comes, is closed after REQUEST_SECONDS
    (it held its thread for ever, so many of them exhausted the witness)."""
    monkeypatch.setattr(witness, "REQUEST_SECONDS", 0.5)
    server = ThreadingHTTPServer(("127.0.0.1", 0), witness._handler(make_witness(tmp_path, Log())))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as conn:
            conn.sendall(sent)
            started = time.monotonic()
            assert conn.recv(4096) == b""  # closed by the witness, no answer
            assert time.monotonic() - started < 3
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
