"""AC-TASKS-EXTERNAL-ID-001.1 under contention: 32 concurrent creates of one
new external ID give exactly one task and one Created; every other answer is
Found with the same task id. Separate OS processes on PostgreSQL, threads on
SQLite (its one-writer file is the embedded default, served by one process)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from typing import Any

import pytest

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.domain.agent_session import session_id_for
from tests.integration.concurrency_worker import create_once
from tests.integration.helpers import task_created_count

CONTENDERS = 32
# Registered, Claimed, Completed + Task.CreatedActive (domain/creation.claim with completed=True)
EVENTS_OF_ONE_CREATION = 4


def _events_after(services: Any, position: int) -> int:
    """Events recorded after ``position`` (PostgreSQL ids may skip a number when
    a loser's insert is rolled back, so count rather than subtract)."""
    return len(services.app.recorder.select_notifications(start=position + 1, limit=10_000))


def _assert_exactly_one_winner(results: list[tuple[str, str, str]], services: Any) -> None:
    errors = [r for r in results if r[0] == "error"]
    assert not errors, errors
    assert len(results) == CONTENDERS
    outcomes = [r[0] for r in results]
    assert outcomes.count("created") == 1
    assert set(outcomes) <= {"created", "found_settled", "found_unsettled"}
    assert len({r[1] for r in results}) == 1, "every answer names the same task"
    assert len({r[2] for r in results}) == 1
    assert task_created_count(services) == 1


def _storm(
    settings: Any, secret: str, body: dict[str, Any], environ: dict[str, str] | None = None
) -> list[tuple[str, str, str]]:
    """CONTENDERS processes, each with services of its own on ``settings``'
    store, create ``body`` at once. They are forked by a fork server that has
    imported the store's modules once (a spawned process imported them itself:
    about 1 s of CPU each, 32 a storm, on 2 cores); each still opens its own
    pool and connections after the fork. ``environ``: set in each process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.integration.concurrency_worker"])
    barrier = context.Barrier(CONTENDERS)
    out = context.Queue()
    processes = [
        context.Process(
            target=create_once, args=(settings, secret, body, barrier, out, environ or {})
        )
        for _ in range(CONTENDERS)
    ]
    for process in processes:
        process.start()
    try:
        results = [out.get(timeout=180) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return results


@pytest.mark.postgres_only
def test_32_processes_creating_one_external_id_make_one_task(settings, services, member):
    _, secret = member
    before = services.app.max_notification_id()
    results = _storm(settings, secret, {"external_id": "STORM-1", "title": "storm"})
    _assert_exactly_one_winner(results, services)
    # Losers may have burnt an office number (the one permitted leak) — nothing else.
    assert _events_after(services, before) == EVENTS_OF_ONE_CREATION


@pytest.mark.postgres_only
def test_32_process_storm_with_start_agent_launches_exactly_one_agent(
    settings, services, member
):
    _, secret = member
    body = {"external_id": "STORM-AGENT", "title": "storm", "start_agent": True}
    results = _storm(settings, secret, body, {"KANDEV_DEMO_AGENT_SECONDS": "60"})
    task_id = results[0][1]
    run_id = str(session_id_for(uuid.UUID(task_id))) if results[0][0] != "error" else ""
    try:
        _assert_exactly_one_winner(results, services)
        assert len(processes_for_run(run_id)) == 1
    finally:
        if run_id:
            stop_run(run_id)


def test_32_threads_creating_one_external_id_make_one_task(services, member):
    _, secret = member
    principal = services.tokens.authenticate(secret)
    before = services.app.max_notification_id()
    barrier = threading.Barrier(CONTENDERS)
    results: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def contender() -> None:
        barrier.wait(timeout=60)
        try:
            result = services.creation.create(principal, {"external_id": "STORM-2", "title": "s"})
            entry = (result.outcome.value, result.task["id"], result.task["identifier"])
        except Exception as error:
            entry = ("error", repr(error), "")
        with lock:
            results.append(entry)

    threads = [threading.Thread(target=contender) for _ in range(CONTENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    _assert_exactly_one_winner(results, services)
    assert _events_after(services, before) == EVENTS_OF_ONE_CREATION
