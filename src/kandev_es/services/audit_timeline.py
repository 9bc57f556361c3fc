"""The auditor's page as data: an identity's history (services/history.py)
grouped by tenure — its claim, each step with evidence, recovery, outcome,
release or abort with operation id and actor, and the task it produced (its
facts are on the page itself: the REST route wants a bearer header a browser
does not send).

Plain values only; the template (api/templates/audit/) renders them with
autoescaping, because external ids, titles and evidence are hostile input.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from kandev_es.application import Tasks
from kandev_es.domain.task import TASK_ABORTED, Task
from kandev_es.services.history import UNKNOWN_ACTOR, identity_history


@dataclass
class TaskSummary:
    id: str
    identifier: str = ""
    title: str = ""
    state: str = "missing"  # active, preparing, archived, deleted, aborted, missing
    workflow: str = ""
    workflow_step: str = ""


@dataclass
class Entry:
    """One event of a tenure, as a row of the timeline."""

    version: int
    at: str
    kind: str
    fields: list[tuple[str, str]] = field(default_factory=list)
    # A step's evidence, or a claim's plan (the durable manifest).
    details: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class TenureView:
    number: int
    task: TaskSummary
    claimed_at: str = ""
    actor: str = ""
    status: str = "preparing"
    outcome: str | None = None
    release: dict[str, str] | None = None
    # The owner (the creating request, or the Runtime after RecoveryClaimed).
    owner: str = ""
    abort: dict[str, str] | None = None
    holder: bool = False
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Timeline:
    identity_id: str
    workspace_id: str
    external_id: str
    holder: int | None
    registered_at: str
    tenures: list[TenureView]
    # The tasks the tenures produced, each once, in tenure order.
    tasks: list[TaskSummary] = field(default_factory=list)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _task(app: Tasks, task_id: str) -> TaskSummary:
    task = app.load(uuid.UUID(task_id), Task)
    if task is None:
        return TaskSummary(task_id)
    if task.deleted:
        state = "deleted"
    elif task.phase == TASK_ABORTED:
        state = "aborted"
    elif task.archived:
        state = "archived"
    else:
        state = str(task.phase)
    # A forgotten task's title (or one whose key is lost) reads as None.
    title = "(forgotten)" if task.title is None else task.title
    return TaskSummary(task_id, task.identifier, title, state, task.workflow, task.workflow_step)


def _entry(event: dict[str, Any]) -> Entry:
    kind = event["event"]
    entry = Entry(event["version"], event["timestamp"], kind)
    skip = {"version", "timestamp", "event", "tenure", "evidence", "plan"}
    for key, value in event.items():
        if key not in skip and value is not None:
            entry.fields.append((key, _text(value)))
    details = event.get("evidence") if kind == "StepRecorded" else event.get("plan")
    entry.details = [(k, _text(v)) for k, v in (details or {}).items() if v not in (None, [], {})]
    return entry


def _apply(tenure: TenureView, event: dict[str, Any]) -> None:
    kind = event["event"]
    if kind == "Released" and not event.get("actor"):
        # The row and the summary both name it.
        event = {**event, "actor": UNKNOWN_ACTOR}
    if kind == "Claimed":
        tenure.claimed_at = event["timestamp"]
        tenure.actor = event["actor"]
        tenure.owner = event["owner_id"]
    elif kind == "RecoveryClaimed":
        tenure.owner = event["owner_id"]
    elif kind == "Completing":
        tenure.status = "completing"
    elif kind == "Completed":
        tenure.status = "completed"
        tenure.outcome = event["outcome"]
    elif kind == "Aborting":
        tenure.status = "aborting"
        tenure.abort = {"at": event["timestamp"], "reason": event["reason"], "by": tenure.owner}
    elif kind == "Aborted":
        tenure.status = "aborted"
    elif kind == "Released":
        tenure.release = {
            "at": event["timestamp"],
            "operation_id": event["operation_id"],
            "reason": event["reason"],
            "actor": event["actor"],
        }
    tenure.entries.append(_entry(event))


def identity_timeline(
    app: Tasks, workspace_id: uuid.UUID, external_id: str, *, full: bool
) -> Timeline:
    """The identity's tenures, oldest first (IdentityNotFound if it has none);
    ``full`` or redacted as identity_history."""
    history = identity_history(app, workspace_id, external_id, full=full)
    tenures: dict[int, TenureView] = {}
    registered_at = ""
    for event in history["events"]:
        number = event.get("tenure")
        if number is None:
            registered_at = registered_at or event["timestamp"]
            continue
        if number not in tenures:  # its Claimed: every later event names the tenure
            task_id = event.get("task_id")
            task = _task(app, str(task_id)) if task_id else TaskSummary("")
            tenures[number] = TenureView(number, task)
        _apply(tenures[number], event)
    holder = history["holder"]["tenure"] if history["holder"] else None
    for number, tenure in tenures.items():
        tenure.holder = number == holder
    return Timeline(
        identity_id=history["identity_id"],
        workspace_id=history["workspace_id"],
        external_id=external_id,
        holder=holder,
        registered_at=registered_at,
        tenures=[tenures[n] for n in sorted(tenures)],
        tasks=list({t.task.id: t.task for n, t in sorted(tenures.items()) if t.task.id}.values()),
    )
