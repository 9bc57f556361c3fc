"""Standard Webhooks signatures (https://www.standardwebhooks.com, v1.0.0).

- ``v1``: HMAC-SHA256 of ``{webhook-id}.{webhook-timestamp}.{body}`` with the
  subscription's secret (``whsec_`` + base64 of 32 random bytes). During a
  rotation's overlap the old secret signs too: one ``v1,`` entry per secret.
- ``v1a``: Ed25519 over the same bytes with the server's webhook key, whose
  public half (``whpk_`` + base64) a receiver may verify with alone.

The webhook key is its own file (KANDEV_WEBHOOK_KEY_FILE, default
``<data dir>/webhook.key``, mode 0600, made at the first ``db init``), not
the ledger's checkpoint key: that key signs the history's checkpoints and is
kept where database administrators cannot read it; a webhook key signs
messages whose bodies callers choose, for third parties, many times a
second, and is rotated on its own schedule (docs/webhooks.md: Signatures).

Rotation (``kandev-es webhook rotate-key``): a new key signs from then on and
the old one keeps signing beside it (a second ``v1a,`` entry) until its
overlap ends, so a receiver that has not fetched the new public key yet still
verifies; the published keyring (``GET /api/v1/webhooks/public-key``) names
both meanwhile. The file holds the current key on its first line and each
retiring key on a line of its own with the end of its overlap
(``whsk_... until=<unix seconds>``); a running process reads the file again
when it changes (``KeyFile``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kandev_es.errors import WebhookKeyMissing
from kandev_es.services.ledger_keys import write_private

log = logging.getLogger("kandev_es.webhooks")
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
PRIVATE_PREFIX = "whsk_"
PUBLIC_PREFIX = "whpk_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signed_content(webhook_id: str, timestamp: int, body: bytes) -> bytes:
    return f"{webhook_id}.{timestamp}.".encode() + body


def hmac_signature(secret: str, content: bytes) -> str:
    digest = hmac.new(secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookKey:
    """The server's Ed25519 key for ``v1a`` signatures."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private

    @classmethod
    def generate(cls) -> WebhookKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def parse(cls, text: str) -> WebhookKey:
        seed = base64.b64decode(text.strip().removeprefix(PRIVATE_PREFIX))
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def private_text(self) -> str:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        raw = self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return PRIVATE_PREFIX + base64.b64encode(raw).decode()

    def public_key(self) -> str:
        raw = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return PUBLIC_PREFIX + base64.b64encode(raw).decode()

    def signature(self, content: bytes) -> str:
        return "v1a," + base64.b64encode(self._private.sign(content)).decode()


@dataclass(frozen=True)
class Keyring:
    """The webhook key file's keys: the current one, and the retiring ones
    with the end of their overlap (unix seconds)."""

    current: WebhookKey
    retiring: tuple[tuple[WebhookKey, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Keyring:
        lines = [line.split() for line in text.splitlines() if line.strip()]
        if not lines or len(lines[0]) != 1:
            raise ValueError("a webhook key file starts with its current key (whsk_...)")
        retiring = []
        for line in lines[1:]:
            if len(line) != 2 or not line[1].startswith("until="):
                raise ValueError("a retiring webhook key's line is 'whsk_... until=<seconds>'")
            retiring.append((WebhookKey.parse(line[0]), float(line[1].removeprefix("until="))))
        return cls(WebhookKey.parse(lines[0][0]), tuple(retiring))

    def text(self) -> str:
        lines = [self.current.private_text()]
        lines += [f"{key.private_text()} until={until:.0f}" for key, until in self.retiring]
        return "\n".join(lines) + "\n"

    def signing(self, now: float) -> list[WebhookKey]:
        """The keys that sign now: the current one, and those still in overlap."""
        return [self.current, *(key for key, until in self.retiring if now < until)]

    def published(self, now: float) -> list[dict[str, Any]]:
        """The public keyring: each key that signs now, and until when (None:
        the current key, until the next rotation)."""
        keys: list[dict[str, Any]] = [{"public_key": self.current.public_key(), "until": None}]
        for key, until in self.retiring:
            if now < until:
                when = datetime.fromtimestamp(until, UTC).isoformat().replace("+00:00", "Z")
                keys.append({"public_key": key.public_key(), "until": when})
        return keys

    def rotated(self, now: float, overlap: float) -> Keyring:
        """A new current key; this one signs beside it for ``overlap`` seconds
        (none: it stops now), the retiring ones until their own ends."""
        kept = [(key, until) for key, until in self.retiring if now < until]
        if overlap > 0:
            kept.insert(0, (self.current, float(math.ceil(now + overlap))))  # as the file has it
        return Keyring(WebhookKey.generate(), tuple(kept))


def load_keyring(path: Path, create: bool = False) -> Keyring:
    """The webhook keys from ``path``; made there (mode 0600) when ``create``
    and missing. Another process making it first wins: its key is read."""
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        ring = Keyring(WebhookKey.generate())
        if write_private(path, ring.text(), exclusive=True):
            log.info("webhooks: made the signing key %s (%s)", path, ring.current.public_key())
            return ring
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        # A node whose data dir never ran `db init` (another API node of the
        # same database): no key of its own is made, or receivers holding the
        # deployment's public key would reject what it signs.
        raise WebhookKeyMissing(
            f"no readable webhook signing key at {path} ({error.strerror}): copy the"
            " deployment's key there or set KANDEV_WEBHOOK_KEY_FILE (docs/webhooks.md)"
        ) from error
    return Keyring.parse(text)


def rotate_key(path: Path, overlap: float, now: float | None = None) -> Keyring:
    """``webhook rotate-key``: a new current key in ``path``; the old one signs
    beside it for ``overlap`` seconds. Every node reads the file again within
    RELOAD_SECONDS (copy it to the other nodes' key file within the overlap)."""
    ring = load_keyring(path).rotated(time.time() if now is None else now, overlap)
    write_private(path, ring.text())
    log.warning(
        "webhooks: rotated the signing key %s: %s signs now, the old one for %.0f s more",
        path,
        ring.current.public_key(),
        overlap,
    )
    return ring


RELOAD_SECONDS = 1.0  # how soon a process signs with a rotated key file


class KeyFile:
    """The webhook key file as a running process signs with it: read again
    when it changes (looked at once per RELOAD_SECONDS at most); a file gone
    or broken meanwhile leaves the keys last read in use, with a warning."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._ring = load_keyring(path)
        self._stamp = self._stat()
        self._looked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            found = self.path.stat()
        except OSError:
            return None
        return (found.st_mtime_ns, found.st_size, found.st_ino)

    def ring(self) -> Keyring:
        now = time.monotonic()
        if now - self._looked < RELOAD_SECONDS:
            return self._ring
        with self._lock:
            self._looked = now
            stamp = self._stat()
            if stamp is not None and stamp != self._stamp:
                try:
                    self._ring = load_keyring(self.path)
                    self._stamp = stamp
                except (WebhookKeyMissing, ValueError) as error:
                    log.warning("webhooks: key file %s not read again: %s", self.path, error)
        return self._ring

    def public_key(self) -> str:
        return self.ring().current.public_key()


def signature_header(
    webhook_id: str,
    timestamp: int,
    body: bytes,
    secrets_in_use: list[str],
    keys: list[WebhookKey],
) -> str:
    """``webhook-signature``: a ``v1`` per secret in use, then a ``v1a`` per
    key that signs (two during a key rotation's overlap)."""
    content = signed_content(webhook_id, timestamp, body)
    parts = [hmac_signature(secret, content) for secret in secrets_in_use]
    parts += [key.signature(content) for key in keys]
    return " ".join(parts)
