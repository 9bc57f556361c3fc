"""`kandev-es workspace advance-numbers`: after a restore that may have lost
numbers already issued (a dump restore: docs/operations.md, Backup and
restore), move each workspace's task numbering past them, so no new task
takes an identifier (KAN-5) a caller already saw on a task the restore lost."""

from __future__ import annotations

import json

import click

from kandev_es.cli_usage import AT_LEAST_ONE, open_store, store_options, workspace_id
from kandev_es.errors import KandevError


@click.command("advance-numbers")
@click.option(
    "--by", "by", type=AT_LEAST_ONE, required=True,
    help="numbers to skip per workspace: at least as many tasks as may have been "
    "created after the backup",
)
@click.option("--workspace", "workspace", default=None, help="only this workspace (id or name)")
@store_options
def advance_numbers(by: int, workspace: str | None) -> None:
    """Move each workspace's task numbering past numbers issued after a backup.

    Run it after restoring a dump, before starting the servers: prints each
    workspace with the lowest number its next task can get."""
    services = open_store()
    try:
        only = None if workspace is None else workspace_id(services, workspace)
        for moved, next_number in services.workspaces.advance_numbers(by, only):
            click.echo(json.dumps({
                "id": str(moved.id), "name": moved.name,
                "next_identifier_at_least": f"{moved.task_prefix}-{next_number}",
            }))
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


def register(workspace: click.Group) -> None:
    workspace.add_command(advance_numbers)
