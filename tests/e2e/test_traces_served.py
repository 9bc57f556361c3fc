"""Traces from a real `kandev-es serve` (the otel extra, enabled by the
standard OTEL_* variables) exported over OTLP/HTTP to a receiver in the test
that decodes the protobuf (docs/observability.md: Traces), both backends:

- a create sent with a W3C traceparent yields spans of that trace: the
  request's server span under the caller's span, `create` under it, and under
  `create` the lookup, the claim, each step (with its outcome), the saves and
  the answer; on PostgreSQL, the statements (psycopg instrumentation);
- the launched agent gets TRACEPARENT naming its launch step's span;
- the Runtime's recovery of a creation whose owner died is a new trace linked
  to the create's."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from kandev_es.agent.processes import stop_run
from kandev_es.domain.agent_session import session_id_for
from tests.integration.helpers import make_git_repository
from tests.support.otlp import Receiver, Span
from tests.support.served import ServedProcess, http

AGENT = '#!/bin/sh\necho "$TRACEPARENT" > traceparent.tmp && mv traceparent.tmp traceparent\n'


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def test_a_create_is_one_trace_from_the_caller_to_the_agent_and_recovery_links_to_it(
    settings, tmp_path, receiver
):
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    server = ServedProcess(
        settings,
        tmp_path / "logs",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        KANDEV_AGENT_COMMAND=f"/bin/sh {script}",
        KANDEV_LEASE_SECONDS="1",
        KANDEV_FAILPOINT="repository:after",
    )
    run_id = ""
    try:
        header, trace_id, caller_span = _traceparent()
        created = http(
            "POST",
            server.base + "/api/v1/tasks",
            server.token,
            {
                "workspace_id": server.workspace_id,
                "external_id": "T-1",
                "title": "traced",
                "start_agent": True,
            },
            headers={"traceparent": header},
            timeout=60,
        )
        assert created.status == 200, created.body
        run_id = str(session_id_for(uuid.UUID(created.body["id"])))
        agent_parent = Path(settings.data_dir) / "sessions" / created.body["id"] / "traceparent"
        server.wait_for_file(agent_parent, "the agent never wrote its TRACEPARENT")
        # The request's span ends last (after its answer is sent): once it is
        # here, every span of the create is (one exporting thread, in order).
        spans = receiver.wait(
            lambda got: any(s.trace_id == trace_id and s.parent_span_id == caller_span for s in got)
        )
        _check_create_trace(spans, trace_id, caller_span, settings.database_url is not None)
        launch = next(s for s in spans if s.name == "step agent_launch")
        assert agent_parent.read_text().strip() == f"00-{trace_id}-{launch.span_id}-01"

        recovered_from, dead_trace, _ = _traceparent()
        _owner_dies(server, tmp_path, recovered_from)
        spans = receiver.wait(lambda got: any(s.name == "recover" for s in got), seconds=60)
        recover = next(s for s in spans if s.name == "recover")
        assert [link[0] for link in recover.links] == [dead_trace]
        assert recover.trace_id != dead_trace and recover.parent_span_id == ""
    finally:
        if run_id:
            stop_run(run_id)
        server.stop()


def _check_create_trace(spans: list[Span], trace_id: str, caller_span: str, postgres: bool) -> None:
    ours = [span for span in spans if span.trace_id == trace_id]
    [server_span] = [s for s in ours if s.parent_span_id == caller_span]
    assert server_span.name == "POST /api/v1/tasks" and server_span.kind == 2  # SERVER
    assert server_span.attributes["kandev.request_id"]
    [create] = [s for s in _children(ours, server_span) if s.name == "create"]
    assert create.attributes["kandev.outcome"] == "created"
    by_start = sorted(_children(ours, create), key=lambda span: span.start)
    names = [span.name for span in by_start]
    for expected in ("lookup", "claim", "step agent_session", "step agent_launch"):
        assert expected in names, names
    assert (
        names.index("lookup")
        < names.index("claim")
        < names.index("step agent_session")
        < names.index("step agent_launch")
    ), names
    steps = [s for s in _children(ours, create) if s.name.startswith("step ")]
    assert {s.attributes["kandev.step.outcome"] for s in steps} == {"succeeded"}
    assert all(any(c.name == "save" for c in _children(ours, s)) for s in steps)
    assert [s.name for s in _children(ours, server_span)].count("answer") == 1
    if postgres:  # the statements, under the spans that ran them
        assert any("db.system" in s.attributes or "db.system.name" in s.attributes for s in ours), {
            s.name for s in ours
        }


def _owner_dies(server: ServedProcess, tmp_path: Path, traceparent: str) -> None:
    """A create on a repository whose owner (the worker) is SIGKILLed after
    the branch is made (KANDEV_FAILPOINT): the Runtime finishes it."""
    repo = make_git_repository(tmp_path / "backend")
    registered = http(
        "POST",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/repositories",
        server.token,
        {"name": "backend", "path": str(repo)},
    )
    assert registered.status == 201, registered.body
    with contextlib.suppress(OSError):  # the worker dies mid-answer, as it should
        http(
            "POST",
            server.base + "/api/v1/tasks",
            server.token,
            {
                "workspace_id": server.workspace_id,
                "external_id": "T-2",
                "title": "dies",
                "repositories": ["backend"],
            },
            headers={"traceparent": traceparent},
            timeout=30,
        )


IDLE_S = 8.0
CLIENT = 3  # OTLP's SPAN_KIND_CLIENT


def _quiet(receiver: Receiver, seconds: float, bound: float = 40.0) -> int:
    """Waits until no span has arrived for ``seconds`` (at most ``bound``); how many there are."""
    deadline = time.monotonic() + bound
    seen, since = len(receiver.spans), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if len(receiver.spans) != seen:
            seen, since = len(receiver.spans), time.monotonic()
        elif time.monotonic() - since >= seconds:
            return seen
    raise AssertionError(f"spans kept coming: {[s.name for s in receiver.spans[-20:]]}")


def _leading(server: ServedProcess, bound: float = 40.0) -> None:
    """Until the server's background process leads the projection loop (its log line)."""
    deadline = time.monotonic() + bound
    while "this process leads the projection loop" not in server.output():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)


def test_background_work_is_one_span_when_it_does_something_and_none_when_it_looks(
    settings, tmp_path, receiver
):
    """Issue 46 point 7: an idle server's loops (projections, ledger, Runtime,
    webhooks) poll without making spans, where each poll's statements were a
    root span of their own; the projection pass that moves the read models'
    positions past a create's events is one root span (child `inline
    positions`; on PostgreSQL with its statements), the ledger's pass that
    appends them one root span (children `append`, `sign if due`); the create
    still has its request trace."""
    server = ServedProcess(
        settings,
        tmp_path / "logs",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    try:
        # The background process starts beside the workers, maybe after /healthz
        # answers: once it leads, the first start's events projected and sequenced.
        _leading(server)
        started = _quiet(receiver, 2.0)
        time.sleep(IDLE_S)
        idle = receiver.spans[started:]
        assert len(idle) <= 1, [(s.name, s.parent_span_id) for s in idle]
        header, trace_id, caller_span = _traceparent()
        created = http(
            "POST",
            server.base + "/api/v1/tasks",
            server.token,
            {"workspace_id": server.workspace_id, "external_id": "BG-1", "title": "traced"},
            headers={"traceparent": header},
        )
        assert created.status == 200, created.body

        def projected(got: list[Span]) -> bool:
            return all(
                any(s.name.startswith(name) and s.start > idle_end for s in got)
                for name in ("projections", "ledger sequence")
            )

        idle_end = max((s.start for s in receiver.spans), default=0)
        spans = receiver.wait(
            lambda got: (
                projected(got)
                and any(s.trace_id == trace_id and s.parent_span_id == caller_span for s in got)
            )
        )
        later = spans[started:]
        assert not [s.name for s in later if s.parent_span_id == "" and s.kind == CLIENT]
        [request] = [s for s in later if s.trace_id == trace_id and s.parent_span_id == caller_span]
        assert request.name == "POST /api/v1/tasks"
        passes = [s for s in later if s.name == "projections"]
        assert passes and all(p.parent_span_id == "" for p in passes), passes
        children = [s for s in later if any(s.parent_span_id == p.span_id for p in passes)]
        assert {c.name for c in children} >= {"inline positions"}, children
        sequenced = [s for s in later if s.name == "ledger sequence"]
        assert sequenced and all(s.parent_span_id == "" for s in sequenced), sequenced
        under = {c.name for c in later if any(c.parent_span_id == q.span_id for q in sequenced)}
        assert under >= {"append", "sign if due"}, under
        if settings.database_url is not None:  # the pass's statements, under it
            traces = {p.trace_id for p in passes}
            assert any(c.kind == CLIENT for c in later if c.trace_id in traces)
    finally:
        server.stop()
