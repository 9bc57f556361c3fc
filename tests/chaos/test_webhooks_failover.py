"""Webhooks across a PostgreSQL failover (issue 45 point 5): a pg_auto_failover
formation (scripts/ha-cluster), a served API node on its multi-host URL with a
create load, `kandev-es webhook deliver` beside it and a receiver on
127.0.0.1. The primary dies mid-load (an unplanned failover). Afterwards every
task.created of the feed reached the receiver, first arrivals in feed order,
and an event came twice only as a re-send of the ones after the stored cursor
(the same webhook-id, in order again).

PostgreSQL only, slow (a formation of its own); skipped where the formation
cannot start."""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.chaos.test_failover import failover, formation  # noqa: F401 -- the fixture
from tests.e2e.test_webhooks_served import HOOK_ENV, feed_ids, subscribe
from tests.support.load import CreateLoad
from tests.support.receiver import Receiver
from tests.support.served import Launched, ServedProcess, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def in_order_with_resends(arrived: list[str], expected: list[str]) -> None:
    """Every expected id arrived; first arrivals in feed order; after an
    event the next arrival is the feed's next one, or a restart from an
    earlier position (a re-send after the stored cursor)."""
    index = {webhook_id: n for n, webhook_id in enumerate(expected)}
    firsts = list(dict.fromkeys(arrived))
    assert firsts == expected
    positions = [index[webhook_id] for webhook_id in arrived]
    for before, after in itertools.pairwise(positions):
        assert after == before + 1 or after <= before, (before, after)


def test_deliveries_ride_an_unplanned_failover_losing_and_reordering_nothing(
    formation: tuple[Path, str],  # noqa: F811 -- the fixture imported above
    tmp_path: Path,
) -> None:
    directory, url = formation
    settings = Settings(
        data_dir=tmp_path / "data", database_url=f"{url}&schema=hooks_{uuid.uuid4().hex[:8]}"
    )
    init = run_cli(settings, "db", "init")
    assert init.returncode == 0, init.stderr
    env = {
        **HOOK_ENV,
        "KANDEV_WEBHOOKS_IN_PROCESS": "false",
        "KANDEV_WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 60),
    }
    with (
        Receiver() as receiver,
        ServedProcess(settings, tmp_path / "logs", **env) as server,
        Launched(["webhook", "deliver"], settings, tmp_path / "deliver.log", **env) as deliverer,
    ):
        assert server.token is not None
        subscribe(server, receiver.url)
        load = CreateLoad(
            server.base,
            server.token,
            [server.workspace_id],
            prefix=f"W{uuid.uuid4().hex[:6]}",
            clients=2,
        ).start()
        try:
            receiver.wait_for(lambda r: len(r) >= 5, 120)  # the deliverer leads and delivers
            failover(directory, unplanned=True)
            time.sleep(3)
        finally:
            load.stop()
        assert load.acknowledged(), "no create got through"
        deadline = time.monotonic() + 120
        while True:
            try:
                expected = feed_ids(server)
                break
            except Exception:  # the node still finding the new primary
                assert time.monotonic() < deadline
                time.sleep(1)
        got = receiver.wait_for(lambda r: set(expected) <= {x.webhook_id for x in r}, 120)
        assert deliverer.process.poll() is None, deliverer.log()
    in_order_with_resends([r.webhook_id for r in got], expected)
