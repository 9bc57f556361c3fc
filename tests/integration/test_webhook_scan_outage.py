"""The deliverer's scan survives the store going away at any of its
statements: an error while dropping rotated-out secrets (a failover at that
moment) is logged and the next scan tries again, instead of ending the
delivery thread for good (nothing restarts it)."""

from __future__ import annotations

import time
import uuid

import pytest

from kandev_es.errors import StoreUnavailable


@pytest.fixture
def settings(settings):
    return settings.with_overrides(
        webhook_allow_http=True, webhook_allow_networks=("127.0.0.0/8",)
    )


def test_a_store_error_while_dropping_expired_secrets_ends_only_that_scan(
    services, workspace, monkeypatch
):
    webhooks = services.webhooks.service
    made, _ = webhooks.create(workspace.id, "http://127.0.0.1:9/hook", ["task.created"])
    # (the scan's threads deliver nothing: this process does not lead)
    webhooks.rotate_secret(workspace.id, uuid.UUID(made["id"]), overlap=0)
    time.sleep(0.01)  # the old secret's overlap has ended
    deliverer = services.webhooks.deliverer()

    def away(now: float) -> None:
        raise StoreUnavailable("the store is away (failover)")

    monkeypatch.setattr(deliverer.store, "drop_expired_secrets", away)
    deliverer._start_threads()  # raised before: the delivery thread died with it
    monkeypatch.undo()
    deliverer._start_threads()
    assert all(s.old_secret is None for s in services.webhooks.store.all())
