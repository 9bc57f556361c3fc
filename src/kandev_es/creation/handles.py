"""The private creation handle (AC-5): given only to the request that Created,
bound to its actor (token), tenure and plan hash. Only a hash is stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Handle:
    identity_id: uuid.UUID
    tenure: int
    secret: str

    def __str__(self) -> str:
        return f"{self.identity_id}.{self.tenure}.{self.secret}"


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def handle_hash(secret: str, actor: str, plan_hash: str) -> str:
    return hashlib.sha256(f"{secret}|{actor}|{plan_hash}".encode()).hexdigest()


def parse_handle(text: str) -> Handle | None:
    parts = text.split(".")
    if len(parts) != 3:
        return None
    try:
        return Handle(uuid.UUID(parts[0]), int(parts[1]), parts[2])
    except ValueError:
        return None


def matches(stored_hash: str, secret: str, actor: str, plan_hash: str) -> bool:
    return bool(stored_hash) and hmac.compare_digest(
        stored_hash, handle_hash(secret, actor, plan_hash)
    )
