"""/metrics without a multi-process server (docs/operations.md: Metrics): the process answers
for itself, routes are URL rules (never a raw path with an id in it), methods
and statuses are bounded, and the breaker and stream-slot instruments move
with their state. Counters are process-wide here, so each check is a delta
between two scrapes. Both backends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kandev_es import config, metrics
from kandev_es.api import create_app
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.errors import StoreUnavailable, StreamLimitReached
from kandev_es.services.stream_slots import StreamSlots
from kandev_es.storage.breaker import StoreBreaker

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_now() -> Samples:
    return parse(metrics.exposition(dict).decode())


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample_name, sample_labels), value in samples.items()
        if sample_name == name and set(labels.items()) <= set(sample_labels)
    )


def test_requests_count_by_url_rule_and_bounded_method(services: Services):
    client = create_app(services=services, run_projections=False).test_client()
    token, _ = services.tokens.issue(workspace_id=None, admin=True, label="metrics")
    workspace, _ = services.workspaces.ensure("default")
    auth = {"Authorization": f"Bearer {token}"}

    def scrape() -> Samples:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.content_type.startswith("text/plain; version=0.0.4")
        return parse(response.get_data(as_text=True))

    before = scrape()
    created = client.post(
        "/api/v1/tasks", headers=auth,
        json={"workspace_id": str(workspace.id), "external_id": "SECRET-EXT-7", "title": "t"},
    )
    assert created.status_code == 200 and created.json["outcome"] == "created"
    task_id = created.json["id"]
    assert client.get(f"/api/v1/tasks/{task_id}", headers=auth).status_code == 200
    missing = uuid.uuid4()
    assert client.get(f"/api/v1/tasks/{missing}", headers=auth).status_code == 404
    assert client.get(f"/no/such/{task_id}").status_code == 404
    assert client.open("/healthz", method="BREW").status_code == 405
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    rule = {"method": "GET", "route": "/api/v1/tasks/<task_id>"}
    assert delta("kandev_http_requests_total", status="200", **rule) == 1
    assert delta("kandev_http_requests_total", status="404", **rule) == 1
    assert delta("kandev_http_request_duration_seconds_count", **rule) == 2
    assert delta("kandev_http_requests_total", route="unmatched", status="404") == 1
    # No rule matched a method it has: unmatched too, and the method is not a label value.
    assert delta("kandev_http_requests_total", method="OTHER", route="unmatched", status="405") == 1
    assert delta("kandev_creations_total", outcome="created") == 1
    labels = "".join(str(key) for key in after)
    for secret in (task_id, str(missing), str(workspace.id), token, "SECRET-EXT-7", "BREW"):
        assert secret not in labels


def test_a_batch_counts_each_items_outcome_and_error(services: Services):
    """A batch counts every item as a single create would (one increment per
    outcome, of the number of its items)."""
    client = create_app(services=services, run_projections=False).test_client()
    token, _ = services.tokens.issue(workspace_id=None, admin=True, label="metrics")
    workspace, _ = services.workspaces.ensure("default")
    auth = {"Authorization": f"Bearer {token}"}
    items = [{"external_id": f"MB-{n}", "title": "t"} for n in range(3)]
    first = client.post("/api/v1/tasks/batch", headers=auth,
                        json={"workspace_id": str(workspace.id), "tasks": items[:1]})
    assert first.status_code == 200
    before = scrape_now()
    answer = client.post(
        "/api/v1/tasks/batch", headers=auth,
        json={"workspace_id": str(workspace.id), "tasks": [*items, {"title": ""}]},
    )
    assert answer.status_code == 200
    after = scrape_now()

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("kandev_creations_total", outcome="created") == 2
    assert delta("kandev_creations_total", outcome="found_settled") == 1
    assert delta("kandev_creation_errors_total") == 1


def test_a_refused_create_counts_its_error_type(services: Services):
    client = create_app(services=services, run_projections=False).test_client()
    token, _ = services.tokens.issue(workspace_id=None, admin=True, label="metrics")
    workspace, _ = services.workspaces.ensure("default")
    before = scrape_now()
    refused = client.post(
        "/api/v1/tasks", headers={"Authorization": f"Bearer {token}"},
        json={"workspace_id": str(workspace.id), "external_id": "BLANK-1", "title": ""},
    )
    assert refused.status_code == 422
    after = scrape_now()
    errors = "kandev_creation_errors_total"
    counted = total(after, errors, error="ValidationFailed")
    assert counted - total(before, errors, error="ValidationFailed") == 1
    assert total(after, "kandev_creations_total") == total(before, "kandev_creations_total")


def test_breaker_gauge_follows_open_and_close():
    now = [100.0]
    breaker = StoreBreaker(probe_interval=0.5, clock=lambda: now[0])
    before = scrape_now()
    breaker.failed("connection refused")
    opened = scrape_now()
    assert total(opened, "kandev_store_breaker_open") == 1
    openings = "kandev_store_breaker_openings_total"
    assert total(opened, openings) - total(before, openings) == 1
    now[0] += 1.0
    assert breaker.admit() is True  # the probe
    breaker.succeeded(started=now[0])
    assert total(scrape_now(), "kandev_store_breaker_open") == 0


def test_stream_slots_move_the_open_gauge_and_count_refusals():
    slots = StreamSlots(per_process=2, per_token=1)
    token, other = uuid.uuid4(), uuid.uuid4()
    before = scrape_now()
    slots.take(token)
    with pytest.raises(StreamLimitReached):
        slots.take(token)  # the token's cap
    slots.take(other)
    with pytest.raises(StreamLimitReached):
        slots.take(uuid.uuid4())  # the process's cap
    held = scrape_now()
    assert total(held, "kandev_streams_open") - total(before, "kandev_streams_open") == 2
    refusals = "kandev_stream_refusals_total"
    assert total(held, refusals, limit="token") - total(before, refusals, limit="token") == 1
    assert total(held, refusals, limit="process") - total(before, refusals, limit="process") == 1
    slots.give_back(token)
    slots.give_back(other)
    assert total(scrape_now(), "kandev_streams_open") == total(before, "kandev_streams_open")


TOO_EARLY = """
import logging, sys
from pathlib import Path
import prometheus_client  # imported before the directory is named (as preload_app would)
from kandev_es import config, metrics
logging.basicConfig(stream=sys.stderr)
config.export_multiprocess_metrics_dir(Path(sys.argv[1]))
metrics.record_creation("created")
print(metrics.exposition(dict).decode())
"""


def test_prometheus_imported_too_early_answers_for_its_process_and_says_so(tmp_path):
    directory = tmp_path / "metrics"
    directory.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TOO_EARLY, str(directory)],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != config.METRICS_DIR_VARIABLE},
    )
    assert done.returncode == 0, done.stderr
    assert "metrics are per worker" in done.stderr
    assert total(parse(done.stdout), "kandev_creations_total", outcome="created") == 1
    assert not list(directory.iterdir())  # nothing pretended to be shared


def test_a_runtime_recovery_counts_its_result_and_steps(
    settings, client, workspace, member, tmp_path
):
    from tests.integration.helpers import create, make_git_repository
    from tests.integration.test_runtime_recovery import LEASE, crash_create

    short_lease = bootstrap(settings.with_overrides(lease_seconds=LEASE))
    try:
        path = make_git_repository(tmp_path / "backend")
        short_lease.repositories.register(workspace.id, "backend", str(path))
        _, secret = member
        body = {"external_id": "MR-1", "title": "t", "repositories": ["backend"]}
        crash_create(settings, secret, body, "repository:after")  # the owner dies
        before = scrape_now()
        time.sleep(LEASE + 0.2)
        [recovery] = short_lease.runtime().recover_once()
        assert recovery.phase == "completed"
        after = scrape_now()
    finally:
        short_lease.close()
    recoveries = "kandev_runtime_recoveries_total"
    completed = {"result": "completed"}
    assert total(after, recoveries, **completed) - total(before, recoveries, **completed) == 1
    steps = "kandev_creation_steps_total"
    # The branch was made but never recorded: the Runtime reconciles it as succeeded.
    succeeded = {"kind": "repository", "result": "succeeded"}
    assert total(after, steps, **succeeded) - total(before, steps, **succeeded) == 1
    assert create(client, secret, **body).json["outcome"] == "found_settled"


def test_a_store_failure_at_scrape_leaves_out_only_the_projection_lag():
    def lag_unreadable() -> dict[str, int]:
        raise StoreUnavailable("database unavailable")

    samples = parse(metrics.exposition(lag_unreadable).decode())
    assert not [name for name, _ in samples if name == "kandev_projection_lag_events"]
    assert ("kandev_store_breaker_open", ()) in samples


@pytest.mark.postgres_only
def test_a_checkout_that_waits_for_a_pooled_connection_is_counted(settings):
    """kandev_pool_waits_total: a checkout finding no idle connection (the
    pool at its size, every connection out) waits, and is counted once."""
    from psycopg_pool import ConnectionPool

    from kandev_es.config import postgres_target
    from kandev_es.storage.pools import serve_most_recent_first

    pool = ConnectionPool(postgres_target(settings.database_url).conninfo, min_size=1,
                          max_size=1, open=True)
    serve_most_recent_first(pool)
    try:
        pool.wait()  # its one connection made and idle
        before = total(scrape_now(), "kandev_pool_waits_total")
        with pool.connection():  # an idle one is there: no wait
            assert total(scrape_now(), "kandev_pool_waits_total") == before
            with pytest.raises(Exception, match="couldn't get a connection"):
                pool.getconn(timeout=0.2)  # every connection out: it waits, then refuses
        assert total(scrape_now(), "kandev_pool_waits_total") == before + 1
    finally:
        pool.close()
