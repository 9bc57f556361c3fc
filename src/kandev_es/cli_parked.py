"""``kandev-es creations``: the creations the recovery Runtime parked, listed
with their reason and evidence, and settled by an operator (``retry`` after a
repair, or ``abort``), idempotent by ``--operation-id`` like ``release``.
The runbook is docs/operations.md ("Parked creations"). Registered on the
``kandev-es`` group by cli.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import click

from kandev_es.cli_usage import UUID_ARGUMENT, open_store, store_options, workspace_id
from kandev_es.errors import KandevError


def _emit(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, default=str))


@click.command("parked")
@click.option("--workspace", default=None, help="workspace id or name [default: all]")
@store_options
def parked_list(workspace: str | None) -> None:
    """List parked creations, one JSON line each: reason, phase, step evidence."""
    services = open_store()
    try:
        target = workspace_id(services, workspace) if workspace is not None else None
        found = services.parked().list(target)
        for entry in found:
            _emit(entry)
        click.echo(f"creations: {len(found)} parked")
    except KandevError as error:
        raise click.ClickException(f"{error.code}: {error.message}") from None
    finally:
        services.close()


def _settle_command(action: str, summary: str) -> click.Command:
    @click.command(action, help=summary)
    @click.option("--workspace", required=True, help="workspace id or name")
    @click.argument("identity_id", type=UUID_ARGUMENT)
    @click.option(
        "--operation-id", required=True, help="stable id: a replay returns the same result"
    )
    @click.option("--tenure", type=click.IntRange(min=1), default=None, help="which tenure")
    @store_options
    def settle(
        workspace: str, identity_id: uuid.UUID, operation_id: str, tenure: int | None
    ) -> None:
        services = open_store()
        try:
            target = workspace_id(services, workspace)
            # The local CLI reaches the store directly: no token, so the actor is "cli".
            result = services.parked().settle(
                action, target, identity_id, operation_id, actor="cli", tenure=tenure
            )
            _emit({"replayed": result.replayed, **result.body})
        except KandevError as error:
            raise click.ClickException(f"{error.code}: {error.message}") from None
        finally:
            services.close()

    return settle


def register(main: click.Group) -> None:
    creations = click.Group("creations", help="Creations the recovery Runtime parked (operators).")
    creations.add_command(parked_list)
    creations.add_command(
        _settle_command(
            "retry",
            "Retry the parked creation of identity IDENTITY_ID after a repair: the Runtime"
            " takes it over afresh.",
        )
    )
    creations.add_command(
        _settle_command(
            "abort",
            "Abort the parked creation of identity IDENTITY_ID: remove its branch, worktree,"
            " agent (forcibly if need be), with evidence; the identity is then free.",
        )
    )
    main.add_command(creations)
