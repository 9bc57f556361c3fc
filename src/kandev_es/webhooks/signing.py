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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kandev_es.errors import WebhookKeyMissing

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


def load_key(path: Path, create: bool = False) -> WebhookKey:
    """The webhook key from ``path``; made there (mode 0600) when ``create``
    and missing. Another process making it first wins: its key is read."""
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = WebhookKey.generate()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return WebhookKey.parse(path.read_text(encoding="utf-8"))
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(key.private_text() + "\n")
        log.info("webhooks: made the signing key %s (%s)", path, key.public_key())
        return key
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
    return WebhookKey.parse(text)


def signature_header(
    webhook_id: str, timestamp: int, body: bytes, secrets_in_use: list[str], key: WebhookKey
) -> str:
    """``webhook-signature``: a ``v1`` per secret in use, then ``v1a``."""
    content = signed_content(webhook_id, timestamp, body)
    parts = [hmac_signature(secret, content) for secret in secrets_in_use]
    parts.append(key.signature(content))
    return " ".join(parts)
