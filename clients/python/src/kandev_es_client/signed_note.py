"""C2SP signed notes (c2sp.org/signed-note) with Ed25519, and the
``tlog-checkpoint`` note text (c2sp.org/tlog-checkpoint): origin, tree size,
base64 root. Pure, no I/O; checked against the spec's published example and
the Go reference implementation's (golang.org/x/mod/sumdb/note) key and note
(tests/fixtures/merkle/signed-note-vectors.json).

A keyring holds verifier keys with **validity windows in tree sizes**: a
checkpoint carries no trusted time, but its size is signed, so "this key signs
checkpoints from size A up to size B" is checkable offline, and a retired key
(or a stolen one) cannot sign a larger tree that the keyring accepts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
except ModuleNotFoundError as missing:  # the plain client install: httpx only
    raise ModuleNotFoundError(
        f"{missing}: the verifier needs pip install 'kandev-es-client[verify]'",
        name=missing.name,
    ) from None

ED25519 = 0x01
EM_DASH = "\u2014"
MAX_SIGNATURES = 16
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


class NoteError(ValueError):
    """A note, key or checkpoint that is malformed or does not verify."""


def key_id(name: str, public_key: bytes) -> bytes:
    """SHA-256(key name || 0x0A || 0x01 || public key)[:4] (signed-note, Ed25519)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public_key).digest()[:4]


def _check_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise NoteError(f"bad key name {name!r}")


def _b64(text: str) -> bytes:
    if not _BASE64.match(text):
        raise NoteError("not standard base64")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as error:
        raise NoteError(f"not standard base64: {error}") from None


@dataclass(frozen=True)
class Verifier:
    name: str
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.public_key)

    def vkey(self) -> str:
        encoded = base64.b64encode(bytes([ED25519]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    def verify(self, text: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, text)
        except InvalidSignature:
            return False
        return True


def parse_vkey(vkey: str) -> Verifier:
    """``<name>+<hex key id>+<base64(0x01 || public key)>``."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError("a verifier key is name+keyid+key")
    name, hex_id, encoded = parts
    _check_name(name)
    material = _b64(encoded)
    if len(material) != 33 or material[0] != ED25519:
        raise NoteError("only Ed25519 verifier keys are supported")
    verifier = Verifier(name, material[1:])
    if hex_id != verifier.key_id.hex():
        raise NoteError("the verifier key's id does not match its name and key")
    return verifier


@dataclass(frozen=True)
class Signer:
    name: str
    seed: bytes  # the 32-byte Ed25519 private key

    @property
    def verifier(self) -> Verifier:
        public = Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return Verifier(self.name, public.public_bytes(Encoding.Raw, PublicFormat.Raw))

    def skey(self) -> str:
        encoded = base64.b64encode(bytes([ED25519]) + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{encoded}"

    def sign(self, text: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.seed).sign(text)


def parse_skey(skey: str) -> Signer:
    """``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || seed)>``."""
    parts = skey.strip().split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("a signer key is PRIVATE+KEY+name+keyid+key")
    name, hex_id, encoded = parts[2:]
    _check_name(name)
    material = _b64(encoded)
    if len(material) != 33 or material[0] != ED25519:
        raise NoteError("only Ed25519 signer keys are supported")
    signer = Signer(name, material[1:])
    if hex_id != signer.verifier.key_id.hex():
        raise NoteError("the signer key's id does not match its name and key")
    return signer


def generate_signer(name: str) -> Signer:
    _check_name(name)
    seed = Ed25519PrivateKey.generate().private_bytes_raw()
    return Signer(name, seed)


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("a note's text ends with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note holds no control characters but newlines")


def sign_note(text: str, signer: Signer) -> str:
    _check_text(text)
    blob = signer.verifier.key_id + signer.sign(text.encode())
    return f"{text}\n{EM_DASH} {signer.name} {base64.b64encode(blob).decode()}\n"


@dataclass(frozen=True)
class NoteSignature:
    name: str
    key_id: bytes
    signature: bytes


def split_note(note: str) -> tuple[str, list[NoteSignature]]:
    """The text and the signature lines, split at the last blank line."""
    _check_text(note)
    cut = note.rfind("\n\n")
    if cut < 0:
        raise NoteError("a note has a blank line before its signatures")
    text, lines = note[: cut + 1], note[cut + 2 :].splitlines()
    if not lines or len(lines) > MAX_SIGNATURES:
        raise NoteError("a note has between 1 and 16 signature lines")
    signatures = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != EM_DASH:
            raise NoteError(f"malformed signature line {line!r}")
        _check_name(parts[1])
        blob = _b64(parts[2])
        if len(blob) < 5:
            raise NoteError("a signature is a key id and a signature")
        signatures.append(NoteSignature(parts[1], blob[:4], blob[4:]))
    return text, signatures


def open_note(note: str, verifiers: Iterable[Verifier]) -> tuple[str, list[Verifier]]:
    """The note's text and the known keys whose signatures verified. Unknown
    keys are ignored; a known key whose signature fails rejects the note, as
    does a note no known key signed."""
    text, signatures = split_note(note)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified: list[Verifier] = []
    for signature in signatures:
        verifier = known.get((signature.name, signature.key_id))
        if verifier is None:
            continue
        if not verifier.verify(text.encode(), signature.signature):
            raise NoteError(f"the signature of {signature.name} does not verify")
        verified.append(verifier)
    if not verified:
        raise NoteError("no signature from a known key")
    return text, verified


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    # Extension lines after the root (signed with it; not part of the tree
    # head, so two checkpoints of one size and root compare equal).
    extensions: tuple[str, ...] = field(default=(), compare=False)

    def text(self) -> str:
        extra = "".join(f"{line}\n" for line in self.extensions)
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n{extra}"


def parse_checkpoint(text: str) -> Checkpoint:
    """A tlog-checkpoint note text: origin, size, base64 root, then optional
    extension lines (kept as they are: opaque to the format; kandev-es's map of
    stream heads is one, kandev_es_client.heads)."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise NoteError("a checkpoint is origin, size and root, one per line")
    origin, size, root = lines[0], lines[1], lines[2]
    if not re.fullmatch(r"0|[1-9][0-9]*", size):
        raise NoteError("a checkpoint's size is a decimal without leading zeroes")
    decoded = _b64(root)
    if len(decoded) != 32:
        raise NoteError("a checkpoint's root is 32 bytes")
    return Checkpoint(origin, int(size), decoded, tuple(lines[3:-1]))


@dataclass(frozen=True)
class KeyringEntry:
    """A key and the checkpoint sizes it may sign: ``from_size`` up to
    ``until_size`` inclusive (None: no upper bound yet)."""

    verifier: Verifier
    from_size: int = 0
    until_size: int | None = None

    def covers(self, size: int) -> bool:
        return self.from_size <= size and (self.until_size is None or size <= self.until_size)

    def to_dict(self) -> dict[str, object]:
        return {
            "vkey": self.verifier.vkey(),
            "from_size": self.from_size,
            "until_size": self.until_size,
        }


@dataclass(frozen=True)
class Keyring:
    """A log's keys, each with its window, and the log's origin: the keyring
    file's ``origin``, else the keys' one name (a kandev-es key is named after
    the origin it signs as). A checkpoint of another origin is refused."""

    entries: Sequence[KeyringEntry]
    origin: str | None = None

    @property
    def expected_origin(self) -> str | None:
        names = {e.verifier.name for e in self.entries}
        return self.origin or (names.pop() if len(names) == 1 else None)

    def to_json(self) -> str:
        body: dict[str, object] = {"origin": self.origin} if self.origin else {}
        body["keys"] = [e.to_dict() for e in self.entries]
        return json.dumps(body, indent=2) + "\n"

    def open_checkpoint(self, note: str, origin: str | None = None) -> Checkpoint:
        """The checkpoint of ``note`` if a key whose window covers its size
        signed it and its origin is ``origin`` (default: the keyring's)."""
        text, _ = split_note(note)
        checkpoint = parse_checkpoint(text)
        origin = origin or self.expected_origin
        if origin is not None and checkpoint.origin != origin:
            raise NoteError(f"checkpoint origin {checkpoint.origin!r}, expected {origin!r}")
        valid = [e.verifier for e in self.entries if e.covers(checkpoint.size)]
        try:
            open_note(note, valid)
        except NoteError as error:
            raise NoteError(f"checkpoint of size {checkpoint.size}: {error}") from None
        return checkpoint


def parse_keyring(text: str) -> Keyring:
    """A keyring file: JSON ``{"origin", "keys": [{"vkey", "from_size", "until_size"}]}``
    (``origin`` optional),
    or plain verifier keys one per line (each valid for every size)."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return Keyring([KeyringEntry(parse_vkey(line)) for line in stripped.splitlines() if line])
    try:
        raw = json.loads(stripped)
        origin = raw.get("origin")
        if origin is not None:
            _check_name(str(origin))
        return Keyring(
            [
                KeyringEntry(
                    parse_vkey(str(item["vkey"])),
                    int(item.get("from_size") or 0),
                    None if item.get("until_size") is None else int(item["until_size"]),
                )
                for item in raw["keys"]
            ],
            None if origin is None else str(origin),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise NoteError(f"malformed keyring: {error}") from None
