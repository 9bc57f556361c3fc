"""The ledger's files beside the checkpoint signing key (docs/auditing.md,
"Keys, the origin and the signer's anchor"), all in the key's directory,
mode 0600 (a key or anchor the group or others may read is refused at start):

- ``ledger.key``: the signed-note Ed25519 private key; its name is the log's
  origin.
- ``ledger.keyring.json``: the deployment's origin and every key it signed
  with, each with the tree sizes it may sign (``audit keyring`` prints it;
  auditors get it through another channel than the server).
- ``ledger.anchor``: the last checkpoint this host signed (a signed note).
  The sequencer signs only a tree that is a consistent extension of it, so a
  database rewritten by whoever can write to it is never signed (RFC 9162
  §4.11; Trillian keeps its signed roots apart from its storage likewise).
- ``ledger.reanchors``: the signed re-anchor statements (``audit
  reanchor``), each naming the old and the new root after a restore.

The other names follow the key's: ``KANDEV_LEDGER_KEY_FILE=/etc/kandev/log.key``
puts the anchor at ``/etc/kandev/log.anchor``.

"Never had a key" (no key, no keyring, no anchor, no checkpoint in the store:
the first start makes one) is told apart from "lost the key" (any of those
left): a lost key stops signing until ``audit rotate-key``."""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from kandev_es_client.signed_note import (
    Checkpoint,
    Keyring,
    KeyringEntry,
    NoteError,
    Signer,
    generate_signer,
    parse_checkpoint,
    parse_keyring,
    parse_skey,
    split_note,
)

from kandev_es.config import Settings
from kandev_es.errors import LedgerKeyUnsafe, LedgerRefused

log = logging.getLogger("kandev_es.ledger")
# A deployment's own origin: this prefix and a random deployment id (a UUID4's
# 32 hex digits) made once with its first key, unless KANDEV_LEDGER_ORIGIN names one.
ORIGIN_PREFIX = "kandev-es.local/log/"
ROTATE = "kandev-es audit rotate-key"


@dataclass(frozen=True)
class KeyFiles:
    key: Path

    @property
    def anchor(self) -> Path:
        return self.key.with_suffix(".anchor")

    @property
    def keyring(self) -> Path:
        return self.key.with_suffix(".keyring.json")

    @property
    def reanchors(self) -> Path:
        return self.key.with_suffix(".reanchors")

    def had_key(self) -> bool:
        """A key signed here before (its keyring or anchor is still there)."""
        return self.keyring.exists() or self.anchor.exists()


def key_files(settings: Settings) -> KeyFiles:
    return KeyFiles(settings.ledger_key_path)


def _temporary(path: Path, text: str) -> Path:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    return temporary


def write_private(path: Path, text: str, exclusive: bool = False) -> bool:
    """``text`` into ``path`` whole or not at all, readable by its owner only;
    ``exclusive``: only if there is no such file yet (whether it was written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary(path, text)
    try:
        if not exclusive:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        temporary.unlink(missing_ok=True)


def check_private(path: Path) -> None:
    """Refuse a file its group or others may read or write (the key, the anchor)."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise LedgerKeyUnsafe(
            f"{path} has mode {mode:04o}: its group or others may read it;"
            f" run chmod 600 {path} (docs/auditing.md)"
        )


def read_keyring(files: KeyFiles) -> Keyring | None:
    """The keyring beside the key; None when there is none yet."""
    try:
        text = files.keyring.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return parse_keyring(text)


def write_keyring(files: KeyFiles, ring: Keyring) -> None:
    write_private(files.keyring, ring.to_json())


def read_signer(files: KeyFiles) -> Signer:
    """The signing key, or LedgerRefused saying why there is none to use."""
    try:
        check_private(files.key)
        return parse_skey(files.key.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LedgerRefused(
            f"the checkpoint signing key {files.key} is missing; checkpoints were signed"
            f" before, so no new key is made: signing stops until an operator runs"
            f" `{ROTATE}` (docs/auditing.md)"
        ) from None
    except LedgerKeyUnsafe as error:
        raise LedgerRefused(f"{error.message}; signing stops until then") from None
    except (OSError, UnicodeDecodeError, NoteError) as error:
        raise LedgerRefused(
            f"the checkpoint signing key {files.key} cannot be read ({error}): signing"
            f" stops until it is readable again or an operator runs `{ROTATE}`"
        ) from None


def _first_key(settings: Settings, files: KeyFiles) -> None:
    origin = settings.ledger_origin or ORIGIN_PREFIX + uuid.uuid4().hex
    signer = generate_signer(origin)
    if not write_private(files.key, signer.skey() + "\n", exclusive=True):
        return  # another process made it first: theirs stands
    write_keyring(files, Keyring([KeyringEntry(signer.verifier, 0, None)], origin))
    log.info(
        "ledger: made the checkpoint key %s for origin %s (%s)",
        files.key,
        origin,
        signer.verifier.vkey(),
    )


def ensure_key(settings: Settings, signed_before: bool) -> None:
    """At start (``serve``, ``db init``): a key that others may read is
    refused; the first start of a deployment that never signed makes the key
    and the keyring; a key lost after signing (``signed_before``: the store
    holds checkpoints, or the keyring or anchor is here) is not replaced."""
    files = key_files(settings)
    if files.key.exists():
        check_private(files.key)
        if files.anchor.exists():
            check_private(files.anchor)
        if not files.keyring.exists():  # a key made before keyrings were kept
            signer = read_signer(files)
            write_keyring(files, Keyring([KeyringEntry(signer.verifier, 0, None)], signer.name))
        return
    if signed_before or files.had_key():
        log.error("ledger: %s", read_signer_problem(files))
        return
    _first_key(settings, files)


def read_signer_problem(files: KeyFiles) -> str:
    try:
        read_signer(files)
    except LedgerRefused as error:
        return error.message
    return ""


def load_keyring(settings: Settings) -> Keyring:
    """Every key of the deployment with its window (the keyring file), or,
    for a key made before keyrings were kept, that key alone."""
    files = key_files(settings)
    ring = read_keyring(files)
    if ring is not None:
        return ring
    signer = read_signer(files)
    return Keyring([KeyringEntry(signer.verifier, 0, None)], signer.name)


def read_anchor(files: KeyFiles) -> Checkpoint | None:
    """The last checkpoint this host signed (None: it never signed one)."""
    try:
        text, _ = split_note(files.anchor.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return parse_checkpoint(text)


def write_anchor(files: KeyFiles, note: str, force: bool = False) -> None:
    """Keep ``note`` (a signed checkpoint) as the anchor unless the anchor
    already covers more (another process of this host signed further)."""
    new = parse_checkpoint(split_note(note)[0])
    if not force:
        try:
            old = read_anchor(files)
        except (OSError, NoteError):
            old = None
        if old is not None and old.size >= new.size:
            return
    write_private(files.anchor, note)


def rotate(settings: Settings, signed_size: int) -> tuple[Keyring, Signer]:
    """``audit rotate-key``: the open window closes at ``signed_size`` (the
    largest checkpoint signed so far), a new key of the same origin signs from
    ``signed_size + 1``; the old key file, if any, is kept aside as retired."""
    files = key_files(settings)
    ring = read_keyring(files)
    if ring is None:
        old = read_signer(files)  # no keyring and no key: nothing to rotate from
        ring = Keyring([KeyringEntry(old.verifier, 0, None)], old.name)
    origin = ring.expected_origin or settings.ledger_origin
    if origin is None:
        raise LedgerRefused(f"{files.keyring} names no origin: set KANDEV_LEDGER_ORIGIN")
    signer = generate_signer(origin)
    closed = [
        KeyringEntry(
            e.verifier,
            e.from_size,
            signed_size if e.until_size is None else min(e.until_size, signed_size),
        )
        for e in ring.entries
    ]
    new = Keyring([*closed, KeyringEntry(signer.verifier, signed_size + 1, None)], origin)
    if files.key.exists():
        files.key.rename(files.key.with_name(f"{files.key.name}.retired-{uuid.uuid4().hex[:8]}"))
    write_keyring(files, new)
    write_private(files.key, signer.skey() + "\n")
    return new, signer


def append_statement(files: KeyFiles, note: str) -> None:
    """A signed re-anchor statement added to the ones kept beside the key."""
    files.reanchors.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(files.reanchors, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as file:
        file.write(note + "\n")


def adopt_anchor(settings: Settings, latest: str | None) -> None:
    """A deployment that signed before anchors were kept starts from the
    store's latest checkpoint (when the keyring verifies it): trust on first
    use, once; from then on the anchor file is the reference."""
    files = key_files(settings)
    if latest is None or files.anchor.exists() or not files.key.exists():
        return
    try:
        load_keyring(settings).open_checkpoint(latest)
    except (NoteError, LedgerRefused) as error:
        log.error(
            "ledger: the store's latest checkpoint does not verify with this"
            " deployment's key (%s): not anchored to it",
            error,
        )
        return
    write_anchor(files, latest)
    log.warning(
        "ledger: anchored to the store's latest checkpoint (no anchor was kept beside %s yet)",
        files.key,
    )


def window_problem(files: KeyFiles, signer: Signer, size: int) -> str | None:
    """Why ``signer`` may not sign a checkpoint of ``size``: the keyring beside
    it lists no window of that key covering the size (a key file swapped by
    hand rather than by ``audit rotate-key``, whose checkpoints no auditor's
    keyring would accept). None when it may, or when no keyring is kept."""
    try:
        ring = read_keyring(files)
    except (OSError, NoteError) as error:
        return f"the keyring {files.keyring} cannot be read ({error})"
    if ring is None or any(e.verifier == signer.verifier and e.covers(size)
                           for e in ring.entries):
        return None
    return (f"the key in {files.key} has no window in {files.keyring} covering size {size}:"
            f" it was not made by `{ROTATE}`, and auditors' keyrings would refuse what it"
            " signs; put the listed key back or rotate")
