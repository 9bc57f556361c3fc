"""`kandev-es agentctl task create`: run inside an agent, with the run credential
from its environment. Prints the JSON answer; exit 0 on every success outcome,
1 with the error JSON otherwise, 2 when the credential is missing."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from kandev_es.config import load_run_credential


@click.group(short_help="Agent-side commands, with the run credential (KANDEV_RUN_TOKEN).")
def agentctl() -> None:
    """Agent-side commands, authenticated by the run credential (KANDEV_RUN_TOKEN)."""


@agentctl.group("task")
def agentctl_task() -> None:
    """Tasks, as the calling agent run."""


@agentctl_task.command(
    "create", short_help="Create a task; a retry with the same --external-id finds it."
)
@click.option("--title", required=True, help="the task's title")
@click.option("--external-id", default=None, help="create-if-absent by this identity")
@click.option("--description", default=None, help="free text [default: empty]")
@click.option("--parent", "parent_id", default=None, help="parent task id (a subtask)")
@click.option(
    "--start-agent/--no-start-agent", default=False, show_default=True,
    help="launch an agent on the new task",
)
def agentctl_task_create(
    title: str,
    external_id: str | None,
    description: str | None,
    parent_id: str | None,
    start_agent: bool,
) -> None:
    """Create a task; a retry with the same --external-id returns the same task.

    deduplicated=true with creation_complete=false means another create owns the
    identity and has not finished: use that task id; never release and recreate."""
    from kandev_es.agentctl import task_create

    try:
        credential = load_run_credential()
    except LookupError as error:
        click.echo(json.dumps({"error": "no_run_credential", "message": str(error)}))
        sys.exit(2)
    body: dict[str, Any] = {"title": title, "start_agent": start_agent}
    for name, value in (
        ("external_id", external_id),
        ("description", description),
        ("parent_id", parent_id),
    ):
        if value is not None:
            body[name] = value
    answer = task_create(credential, body)
    click.echo(json.dumps(answer.body))
    if not answer.ok:
        sys.exit(1)


def register(main: click.Group) -> None:
    main.add_command(agentctl)
