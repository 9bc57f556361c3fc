"""The webhooks' metrics, read from the database at scrape time (so any API
node answers the same, whichever process delivers):

- ``kandev_webhook_deliveries_total{result}``: attempts by result
  (delivered, failed, no_answer, gone), counted in each attempt's own write;
- ``kandev_webhook_subscriptions{state}``: subscriptions active, paused,
  disabled;
- ``kandev_webhook_lag_seconds{subscription}``: the age of the oldest feed
  event an active subscription has not had a 2xx for (0: caught up). The
  subscription id is a label, and its series are bounded: only active
  subscriptions have one (made by operators, never by callers: at most
  MAX_SUBSCRIPTIONS per workspace), a deleted, paused or disabled one's series
  is gone at the next scrape (nothing is kept between scrapes), and at most
  MAX_LAG_SERIES of them, the furthest behind, are exported however many
  workspaces there are.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from kandev_es.webhooks.deliverer import RESULTS
from kandev_es.webhooks.store import ACTIVE, DISABLED, PAUSED, SubscriptionStore

MAX_LAG_SERIES = 100  # subscriptions with a lag series of their own, the furthest behind


def _age(timestamp: str | None, now: float) -> float:
    if timestamp is None:
        return 0.0
    return max(0.0, now - datetime.fromisoformat(timestamp).timestamp())


def families(store: SubscriptionStore) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counted = store.counters()
    deliveries = CounterMetricFamily(
        "kandev_webhook_deliveries", "Webhook delivery attempts, by result.", labels=["result"]
    )
    for result in RESULTS:
        deliveries.add_metric([result], counted.get(result, 0))
    yield deliveries
    subscriptions = store.all()
    states = GaugeMetricFamily(
        "kandev_webhook_subscriptions", "Webhook subscriptions, by state.", labels=["state"]
    )
    for state in (ACTIVE, PAUSED, DISABLED):
        states.add_metric([state], sum(1 for s in subscriptions if s.state == state))
    yield states
    lag = GaugeMetricFamily(
        "kandev_webhook_lag_seconds",
        "Age of the oldest feed event an active subscription has not delivered (0: none).",
        labels=["subscription"],
    )
    now = time.time()
    lags = [(_age(store.oldest_pending(s), now), str(s.id)) for s in subscriptions
            if s.state == ACTIVE]  # fmt: skip
    for seconds, subscription in sorted(lags, reverse=True)[:MAX_LAG_SERIES]:
        lag.add_metric([subscription], seconds)
    yield lag
