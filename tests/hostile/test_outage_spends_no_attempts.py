"""A store outage never spends a recovery attempt, and never parks a healthy
creation. The owner of a creation dies right after its claim (a real process
SIGKILLed at the failpoint); the Runtime, reaching the real PostgreSQL through
a real TCP proxy (tests/support/pg_proxy.py), takes it over, and each time it
has saved something the database goes away (every connection closed, new ones
refused) -- more outages than KANDEV_RECOVERY_ATTEMPTS allows takeovers. Once
the store is back the creation is completed by the same takeover: one epoch,
nothing parked. PostgreSQL only: an embedded SQLite does not go away."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.errors import StoreUnavailable
from tests.integration.helpers import crash_create, make_git_repository
from tests.support.pg_proxy import PgProxy

pytestmark = pytest.mark.postgres_only

OWNER = "runtime:outage-test"
ATTEMPTS = 2


@pytest.fixture
def proxied_runtime(settings) -> Iterator[tuple[Services, PgProxy]]:
    proxy, url = PgProxy.before(settings.database_url)
    services = bootstrap(
        settings.with_overrides(
            database_url=url,
            runtime_in_process=False,
            lease_seconds=1.0,
            recovery_backoff_seconds=0,
            recovery_attempts=ATTEMPTS,
        )
    )
    yield services, proxy
    services.close()
    proxy.close()


def test_outages_during_a_takeover_spend_no_attempt_and_it_completes_once_the_store_is_back(
    settings, services, workspace, member, tmp_path, proxied_runtime
):
    runtime_services, proxy = proxied_runtime
    repository = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(repository))
    body = {"external_id": "OUT-1", "title": "t", "repositories": ["backend"]}
    crash_create(settings, member[1], body, "claim:after")  # nothing made in the world
    key = identity_id(workspace.id, "OUT-1")
    task_id = services.app.load(key, Identity).tenure(1).task_id
    runtime = runtime_services.runtime(owner_id=OWNER)
    time.sleep(1.2)  # the dead owner's lease runs out

    outages, deadline = 0, time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, f"not recovered after {outages} outages"
        proxy.restore()
        # The takeover's own save names its owner, the drive's step records
        # their keys: each outage starts right after one of them commits.
        proxy.cut_after(OWNER.encode(), f"{task_id}:repository".encode())
        try:
            recovered = runtime.recover_once()
        except StoreUnavailable:
            outages += proxy.sprung.is_set()
            time.sleep(0.1)
            continue
        if recovered:
            break

    assert outages > ATTEMPTS, outages
    assert [(r.identity_id, r.epoch, r.phase) for r in recovered] == [(key, 1, "completed")]
    tenure = services.app.load(key, Identity).tenure(1)
    assert (tenure.phase, tenure.epoch, tenure.takeovers) == ("completed", 1, 1)
    assert runtime.parked() == []
