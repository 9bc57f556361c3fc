"""Webhooks (docs/webhooks.md): subscriptions as cursors on a workspace's feed,
delivered in feed order by the Standard Webhooks rules, SSRF-guarded.

addresses (where a webhook may go), signing (v1 HMAC and v1a Ed25519, the
key), store (the tables), subscriptions (the operators' service), feed (how
the deliverer reads the feed), transport (one attempt over HTTP), deliverer
(the background work), observed (the metrics read at scrape)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kandev_es.application import Tasks
from kandev_es.config import Settings
from kandev_es.storage.database import Database
from kandev_es.webhooks.addresses import NetworkPolicy
from kandev_es.webhooks.deliverer import Deliverer, Rules
from kandev_es.webhooks.feed import StoreFeed
from kandev_es.webhooks.signing import KeyFile, load_keyring, rotate_key
from kandev_es.webhooks.store import SubscriptionStore
from kandev_es.webhooks.subscriptions import WebhookService


@dataclass
class Webhooks:
    """The capability's parts over one store (bootstrap builds it once)."""

    settings: Settings
    app: Tasks
    database: Database
    store: SubscriptionStore
    policy: NetworkPolicy
    service: WebhookService
    _key: KeyFile | None = None
    _deliverer: Deliverer | None = None

    @classmethod
    def build(cls, settings: Settings, app: Tasks, database: Database) -> Webhooks:
        policy = NetworkPolicy.from_settings(
            settings.webhook_allow_networks, settings.webhook_allow_http
        )
        store = SubscriptionStore(database)
        service = WebhookService(store, policy, settings.webhook_secret_overlap)
        return cls(settings, app, database, store, policy, service)

    @property
    def key(self) -> KeyFile:
        if self._key is None:
            self._key = KeyFile(self.settings.webhook_key_path)
        return self._key

    def public_key(self) -> str:
        return self.key.public_key()

    def keyring(self) -> list[dict[str, Any]]:
        """The public keys that verify ``v1a`` now (two during a rotation)."""
        return self.key.ring().published(time.time())

    def rotate_key(self, overlap: float | None = None) -> list[dict[str, Any]]:
        """A new v1a key; the old one signs beside it for ``overlap`` seconds
        (KANDEV_WEBHOOK_SECRET_OVERLAP unless given). The published keyring."""
        wait = self.settings.webhook_secret_overlap if overlap is None else overlap
        ring = rotate_key(self.settings.webhook_key_path, wait)
        return ring.published(time.time())

    def deliverer(self) -> Deliverer:
        """This process's deliverer (one; it delivers only while it leads)."""
        if self._deliverer is None:
            rules = Rules(
                self.policy, self.settings.webhook_retry_schedule, self.settings.webhook_timeout
            )
            feed = StoreFeed(self.database, self.app.settled_rows, self.app.max_notification_id)
            self._deliverer = Deliverer(self.store, feed, self.key, rules)
        return self._deliverer

    def stop(self) -> None:
        if self._deliverer is not None:
            self._deliverer.stop()


def set_up(settings: Settings, database: Database) -> None:
    """``db init``: the tables, and the v1a key (made once, mode 0600)."""
    from kandev_es.webhooks.store import create_tables

    create_tables(database)
    load_keyring(settings.webhook_key_path, create=True)
