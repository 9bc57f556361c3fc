"""A transparency-log witness (c2sp.org/tlog-witness) and its cosignatures
(c2sp.org/tlog-cosignature, Ed25519 ``cosignature/v1``), for kandev-es logs.

A witness keeps, for each log it trusts (an origin and the log's keyring), the
latest checkpoint it cosigned, in a state file of its own. It cosigns a new
checkpoint only when the log's key signed it and a consistency proof from
that checkpoint verifies, so it never cosigns two checkpoints that are not
one append-only history: a log that shows one auditor a tree and another a
different one (a split view) cannot get both cosigned by an honest witness.

    kandev-es-verify witness keygen NAME --key FILE       (prints the vkey)
    kandev-es-verify witness serve --key FILE --state FILE --log KEYRING [--log ...]
        [--listen 127.0.0.1:7380]

``serve`` answers ``POST /add-checkpoint`` as the spec says: 200 and a
cosignature line; 400 malformed; 403 no trusted signature; 404 unknown
origin; 409 (``text/x.tlog.size``: the size it last cosigned) when the old
size is not its own or the same size has another root; 422 when the
consistency proof fails.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import fcntl
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kandev_es_client.merkle import ProofError, verify_consistency
from kandev_es_client.signed_note import (
    EM_DASH,
    Checkpoint,
    Keyring,
    NoteError,
    parse_checkpoint,
    parse_keyring,
    split_note,
)

COSIGNATURE_ALGORITHM = 0x04
MAX_PROOF_LINES = 63
MAX_BODY = 64 * 1024
# A connection's every read waits at most this long (a request's head and
# body): each connection is a thread, so one left open sending nothing held
# its thread for ever.
REQUEST_SECONDS = 10.0
SIZE_TYPE = "text/x.tlog.size"
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_NAME = re.compile(r"^[^\s+]+$")


def _b64decode(text: str, what: str) -> bytes:
    if not _BASE64.match(text):
        raise NoteError(f"{what} is not standard base64")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise NoteError(f"{what} is not standard base64") from None


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    """SHA-256(name || "\\n" || 0x04 || public key)[:4] (tlog-cosignature)."""
    return hashlib.sha256(
        name.encode() + b"\n" + bytes([COSIGNATURE_ALGORITHM]) + public_key
    ).digest()[:4]


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise NoteError(f"bad witness name {name!r}")


@dataclass(frozen=True)
class CosignerKey:
    """A witness's public key, as a vkey ``name+keyid+base64(0x04 || key)``."""

    name: str
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        return cosigner_key_id(self.name, self.public_key)

    def vkey(self) -> str:
        material = base64.b64encode(bytes([COSIGNATURE_ALGORITHM]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{material}"

    def verify(self, checkpoint_text: str, blob: bytes) -> int | None:
        """The cosignature's timestamp when ``blob`` (key id || timestamp ||
        signature) is this witness's cosignature of the checkpoint; else None."""
        if len(blob) != 4 + 8 + 64 or blob[:4] != self.key_id:
            return None
        timestamp = int.from_bytes(blob[4:12], "big")
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(
                blob[12:], cosigned_message(checkpoint_text, timestamp)
            )
        except InvalidSignature:
            return None
        return timestamp


def parse_cosigner_vkey(vkey: str) -> CosignerKey:
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError("a witness key is name+keyid+key")
    name, hex_id, encoded = parts
    _check_name(name)
    material = _b64decode(encoded, "a witness key")
    if len(material) != 33 or material[0] != COSIGNATURE_ALGORITHM:
        raise NoteError("a witness key is an Ed25519 cosigner key (type 0x04)")
    key = CosignerKey(name, material[1:])
    if hex_id != key.key_id.hex():
        raise NoteError("the witness key's id does not match its name and key")
    return key


@dataclass(frozen=True)
class Cosigner:
    name: str
    seed: bytes

    @property
    def key(self) -> CosignerKey:
        public = Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return CosignerKey(self.name, public.public_bytes(Encoding.Raw, PublicFormat.Raw))

    def skey(self) -> str:
        material = base64.b64encode(bytes([COSIGNATURE_ALGORITHM]) + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.key.key_id.hex()}+{material}"

    def cosign(self, checkpoint_text: str, timestamp: int | None = None) -> str:
        """A ``cosignature/v1`` note signature line over the checkpoint's text."""
        when = int(time.time()) if timestamp is None else timestamp
        signature = Ed25519PrivateKey.from_private_bytes(self.seed).sign(
            cosigned_message(checkpoint_text, when)
        )
        blob = self.key.key_id + when.to_bytes(8, "big") + signature
        return f"{EM_DASH} {self.name} {base64.b64encode(blob).decode()}\n"


def generate_cosigner(name: str) -> Cosigner:
    _check_name(name)
    return Cosigner(name, Ed25519PrivateKey.generate().private_bytes_raw())


def parse_cosigner_skey(skey: str) -> Cosigner:
    parts = skey.strip().split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("a witness private key is PRIVATE+KEY+name+keyid+key")
    name, hex_id, encoded = parts[2:]
    _check_name(name)
    material = _b64decode(encoded, "the witness private key")
    if len(material) != 33 or material[0] != COSIGNATURE_ALGORITHM:
        raise NoteError("a witness private key is an Ed25519 cosigner key (type 0x04)")
    cosigner = Cosigner(name, material[1:])
    if hex_id != cosigner.key.key_id.hex():
        raise NoteError("the witness private key's id does not match its name and key")
    return cosigner


def cosigned_message(checkpoint_text: str, timestamp: int) -> bytes:
    """What a ``cosignature/v1`` signs: a header line, the time, the
    checkpoint's whole text (extension lines too)."""
    return f"cosignature/v1\ntime {timestamp}\n{checkpoint_text}".encode()


def cosigners_of(note: str, keys: Sequence[CosignerKey]) -> dict[str, int]:
    """The witnesses among ``keys`` whose cosignature on ``note``'s
    checkpoint verifies: name -> timestamp."""
    text, signatures = split_note(note)
    found: dict[str, int] = {}
    for key in keys:
        for signature in signatures:
            if signature.name != key.name or signature.key_id != key.key_id:
                continue
            when = key.verify(text, signature.key_id + signature.signature)
            if when is not None:
                found[key.name] = when
    return found


def add_checkpoint_body(old_size: int, proof: Sequence[bytes], note: str) -> str:
    lines = [f"old {old_size}", *(base64.b64encode(p).decode() for p in proof)]
    return "\n".join(lines) + "\n\n" + note


class Refused(Exception):
    """An add-checkpoint request the witness does not cosign: its HTTP status
    and the body it answers."""

    def __init__(self, status: int, message: str, content_type: str = "text/plain") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.content_type = content_type


def parse_request(body: str) -> tuple[int, list[bytes], str]:
    """The old size, the consistency proof and the checkpoint note of an
    add-checkpoint body (Refused 400 when malformed)."""
    head, sep, note = body.partition("\n\n")
    lines = head.split("\n")
    if not sep or not re.fullmatch(r"old (0|[1-9][0-9]{0,18})", lines[0]):
        raise Refused(400, "the body starts with 'old <size>', proof lines, an empty line")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise Refused(400, f"at most {MAX_PROOF_LINES} consistency proof lines")
    try:
        proof = [_b64decode(line, "a proof line") for line in lines[1:]]
    except NoteError as error:
        raise Refused(400, str(error)) from None
    return int(lines[0][4:]), proof, note


@dataclass(frozen=True)
class TrustedLog:
    origin: str
    keyring: Keyring


def trusted_log(text: str) -> TrustedLog:
    """A log the witness trusts, from its keyring file (``kandev-es audit
    keyring``): the origin is the keyring's ``origin``, else its keys' name."""
    keyring = parse_keyring(text)
    origin = None
    with contextlib.suppress(ValueError, AttributeError):
        origin = json.loads(text).get("origin")
    names = {entry.verifier.name for entry in keyring.entries}
    if origin is None and len(names) == 1:
        origin = names.pop()
    if not origin:
        raise NoteError('the keyring names no single origin (add "origin" to it)')
    return TrustedLog(str(origin), keyring)


class Witness:
    """The witness's rules over a state file it alone writes: JSON
    ``{"logs": {origin: {"size": n, "root": base64}}}``, changed atomically
    (a lock held from the check to the write, a rename, an fsync)."""

    def __init__(self, cosigner: Cosigner, state: Path, logs: Sequence[TrustedLog]) -> None:
        self.cosigner = cosigner
        self.state = state
        self.logs = {log.origin: log for log in logs}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with self._lock, open(self.state.with_name(self.state.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self._read()

    def _read(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.state.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"logs": {}}
        if not isinstance(raw, dict) or not isinstance(raw.get("logs"), dict):
            raise RuntimeError(f"witness state {self.state} is not a witness's state")
        return raw

    def _write(self, state: Mapping[str, Any]) -> None:
        temporary = self.state.with_name(self.state.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(state, file, indent=2)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.state)
        directory = os.open(self.state.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def last(self, origin: str) -> tuple[int, bytes] | None:
        entry = self._read()["logs"].get(origin)
        return None if entry is None else (int(entry["size"]), base64.b64decode(entry["root"]))

    def add_checkpoint(self, body: str) -> str:
        """The cosignature line for an add-checkpoint request, or Refused."""
        old_size, proof, note = parse_request(body)
        checkpoint = self._open(note)
        if old_size > checkpoint.size:
            raise Refused(400, f"old size {old_size} is above the checkpoint's {checkpoint.size}")
        with self._locked() as state:
            entry = state["logs"].get(checkpoint.origin)
            size = 0 if entry is None else int(entry["size"])
            if old_size != size:
                raise Refused(409, f"{size}\n", SIZE_TYPE)
            if entry is not None:
                self._check_consistent(checkpoint, size, base64.b64decode(entry["root"]), proof)
            elif proof:
                raise Refused(422, "the proof from size 0 must be empty")
            state["logs"][checkpoint.origin] = {
                "size": checkpoint.size,
                "root": base64.b64encode(checkpoint.root).decode(),
            }
            self._write(state)
        return self.cosigner.cosign(checkpoint.text())

    def _open(self, note: str) -> Checkpoint:
        try:
            text, _ = split_note(note)
            checkpoint = parse_checkpoint(text)
        except NoteError as error:
            raise Refused(400, f"not a checkpoint: {error}") from None
        log = self.logs.get(checkpoint.origin)
        if log is None:
            raise Refused(404, f"unknown log {checkpoint.origin!r}")
        try:
            return log.keyring.open_checkpoint(note, checkpoint.origin)
        except NoteError as error:
            raise Refused(403, str(error)) from None

    @staticmethod
    def _check_consistent(
        checkpoint: Checkpoint, size: int, root: bytes, proof: Sequence[bytes]
    ) -> None:
        if size == checkpoint.size:
            if root != checkpoint.root or proof:
                raise Refused(409, f"{size}\n", SIZE_TYPE)
            return
        if size == 0:  # every tree extends the empty one it cosigned: no proof to check
            if proof:
                raise Refused(422, "the proof from size 0 must be empty")
            return
        try:
            verify_consistency(size, checkpoint.size, root, checkpoint.root, proof)
        except ProofError as error:
            raise Refused(422, f"not consistent with size {size}: {error}") from None


def _handler(witness: Witness) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kandev-es-witness"
        timeout = REQUEST_SECONDS

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/add-checkpoint":
                return self._answer(404, "not found\n")
            length = self.headers.get("Content-Length", "")
            if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY:
                return self._answer(400, f"a body of at most {MAX_BODY} bytes\n")
            try:
                raw = self.rfile.read(int(length))
            except TimeoutError:
                self.close_connection = True
                return None
            try:
                body = raw.decode("utf-8")
                return self._answer(200, witness.add_checkpoint(body))
            except UnicodeDecodeError:
                return self._answer(400, "the body is not UTF-8\n")
            except Refused as refused:
                return self._answer(refused.status, refused.message, refused.content_type)

        def _answer(self, status: int, text: str, content_type: str = "text/plain") -> None:
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"witness: {self.address_string()} {format % args}\n")

    return Handler


def serve(witness: Witness, host: str, port: int) -> None:
    server = ThreadingHTTPServer((host, port), _handler(witness))
    print(
        f"witness {witness.cosigner.name} on http://{host}:{server.server_port}"
        f" ({witness.cosigner.key.vkey()})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kandev-es-verify witness", description="A C2SP tlog-witness for kandev-es logs."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser("keygen", help="make a witness key (prints its vkey)")
    keygen.add_argument("name", help="the witness's name, e.g. witness.example.com/w1")
    keygen.add_argument("--key", type=Path, required=True, help="the private key file to make")
    run = commands.add_parser("serve", help="answer POST /add-checkpoint")
    run.add_argument("--key", type=Path, required=True)
    run.add_argument(
        "--state",
        type=Path,
        required=True,
        help="the witness's own record of what it cosigned (JSON)",
    )
    run.add_argument(
        "--log",
        type=Path,
        action="append",
        required=True,
        help="a log's keyring (kandev-es audit keyring); repeatable",
    )
    run.add_argument("--listen", default="127.0.0.1:7380", help="host:port (port 0: any)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "keygen":
            cosigner = generate_cosigner(args.name)
            fd = os.open(args.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(cosigner.skey() + "\n")
            print(cosigner.key.vkey())
            return 0
        if args.key.stat().st_mode & 0o077:
            raise NoteError(f"{args.key} is readable by others: chmod 600 it")
        cosigner = parse_cosigner_skey(args.key.read_text(encoding="utf-8"))
        logs = [trusted_log(path.read_text(encoding="utf-8")) for path in args.log]
        host, _, port = args.listen.rpartition(":")
        witness = Witness(cosigner, args.state, logs)
        witness.last("")  # a state file that is not a witness's fails now, not per request
    except (OSError, NoteError, ValueError, RuntimeError) as error:
        print(f"kandev-es-verify witness: {error}", file=sys.stderr)
        return 2
    serve(witness, host or "127.0.0.1", int(port))
    return 0
