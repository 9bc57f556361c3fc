"""kandev_webhook_lag_seconds{subscription}: one series per active
subscription, read at scrape time (a paused or deleted one's series is gone
at the next scrape), and no more than MAX_LAG_SERIES, the furthest behind."""

from __future__ import annotations

import time
import uuid

import pytest

from kandev_es.webhooks import observed
from tests.integration.helpers import create


@pytest.fixture
def settings(settings):
    return settings.with_overrides(webhook_allow_networks=("127.0.0.0/8",))


def lags(services):
    families = {f.name: f for f in observed.families(services.webhooks.store)}
    return {
        s.labels["subscription"]: s.value for s in families["kandev_webhook_lag_seconds"].samples
    }


def test_the_lag_series_are_the_active_subscriptions_furthest_behind(
    client, services, workspace, member, monkeypatch
):
    hooks = services.webhooks.service
    create(client, member[1], workspace_id=str(workspace.id), title="waiting")
    time.sleep(0.3)
    behind, _ = hooks.create(workspace.id, "https://127.0.0.1:9/a", ["task.created"], after=0)
    caught_up, _ = hooks.create(workspace.id, "https://127.0.0.1:9/b", ["task.created"])
    paused, _ = hooks.create(workspace.id, "https://127.0.0.1:9/c", ["task.created"], after=0)
    hooks.pause(workspace.id, uuid.UUID(paused["id"]))
    found = lags(services)
    assert set(found) == {behind["id"], caught_up["id"]}  # no deliverer runs here
    assert found[behind["id"]] >= 0.3 and found[caught_up["id"]] == 0.0
    monkeypatch.setattr(observed, "MAX_LAG_SERIES", 1)
    assert set(lags(services)) == {behind["id"]}
    hooks.delete(workspace.id, uuid.UUID(behind["id"]))
    assert set(lags(services)) == {caught_up["id"]}
