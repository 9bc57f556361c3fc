"""Operator and auditor commands: ``projections rebuild``, ``identity
history`` and ``audit verify``. Registered on the ``kandev-es`` group by cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kandev_es.cli_usage import AT_LEAST_ONE, open_store, store_options, workspace_id
from kandev_es.config import audit_base_url
from kandev_es.errors import KandevError


def _progress() -> Any:
    """rebuild's progress bar on stderr (rich loads when a rebuild runs, not for --help)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} events/s" if speed else "- events/s", style="cyan")

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


@click.command(
    "rebuild", short_help="Rebuild read models into fresh tables, swapped in atomically."
)
@click.option("--name", "names", multiple=True, help="projection to rebuild (repeatable)")
@click.option(
    "--batch-size",
    default=5000,
    show_default=True,
    type=AT_LEAST_ONE,
    help="events per transaction",
)
@store_options
def projections_rebuild(names: tuple[str, ...], batch_size: int) -> None:
    """Rebuild read models into fresh tables and swap them in atomically."""
    from kandev_es.projections.base import Rebuildable
    from kandev_es.projections.rebuild import rebuild, rebuildable

    services = open_store(create_tables=True)  # tables a new version added must exist first
    runner = services.projections
    try:
        chosen = list(names) or [
            p.name for p in runner.projections if isinstance(p, Rebuildable) and p.tables
        ]
        for name in chosen:
            rebuildable(runner, name)  # every name checked before anything is rebuilt
        for name in chosen:
            with _progress() as bar:
                task = bar.add_task(name, total=None)

                def show(position: int, head: int, applied: int, task: Any = task) -> None:
                    bar.update(task, completed=position, total=head)

                result = rebuild(runner, name, progress=show, batch_size=batch_size)
            click.echo(
                f"rebuilt {name}: {result.position} events scanned, {result.applied} applied"
                f" in {result.seconds:.2f}s ({result.events_per_second:,.0f} events/s);"
                f" saves held {result.paused_seconds * 1000:.0f} ms at the switch"
            )
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command("history", short_help="An identity's whole stream across tenures, as a timeline.")
@click.option("--workspace", "workspace", required=True, help="workspace id or name")
@click.option("--external-id", "external_id", required=True, help="the external ID to show")
@click.option("--json", "as_json", is_flag=True, help="print the history as JSON")
@click.option(
    "--link/--no-link",
    default=True,
    show_default=True,
    help="also print a short-lived link to the auditor's page (not with --json)",
)
@click.option("--proof", is_flag=True,
              help="print the proof bundle (events, chain, inclusion proofs; kandev-es-verify)")
@click.option("--consistency-from", "consistency_from", type=click.IntRange(min=1),
              multiple=True, metavar="SIZE",
              help="with --proof: also prove the bundle's checkpoint extends your checkpoint"
              " of this size (repeatable)")
@store_options
def identity_history_command(
    workspace: str, external_id: str, as_json: bool, link: bool, proof: bool,
    consistency_from: tuple[int, ...],
) -> None:
    """Print an identity's whole stream across tenures as a timeline.

    Then a link to the auditor's HTML page of this identity, at KANDEV_PUBLIC_URL
    (unset: where the `serve` of this data dir listens, else 127.0.0.1:8000): it
    works for this identity only, for KANDEV_AUDIT_LINK_SECONDS (900)."""
    from kandev_es.domain.external_id import normalize_external_id
    from kandev_es.services.history import identity_history, render_timeline

    services = open_store()
    try:
        target = workspace_id(services, workspace)
        normalized = normalize_external_id(external_id)
        if normalized is None:
            raise click.BadParameter("must not be empty", param_hint="--external-id")
        if proof:
            from kandev_es.services.ledger import proof_bundle

            bundle = proof_bundle(services.app, services.database, target, normalized,
                                  consistency_from)
            click.echo(json.dumps(bundle, indent=2))
            return
        history = identity_history(services.app, target, normalized, full=True)  # the host's own
        if as_json:
            click.echo(json.dumps(history, indent=2))
        else:
            click.echo("\n".join(render_timeline(history)))
            if link:
                issued = services.audit_links.issue(
                    audit_base_url(services.settings), target, normalized, issued_by="cli"
                )
                until = issued.expires_at.isoformat(timespec="seconds")
                click.echo(f"\nauditor's page (this identity only, until {until}):\n  {issued.url}")
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command(
    "verify", short_help="Replay Task streams against tasks_view (exit 1 on disagreement)."
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--ledger", is_flag=True,
              help="instead: recompute every chain and the Merkle log (tamper evidence)")
@click.option("--checkpoint", type=click.Path(dir_okay=False, path_type=Path),
              help="with --ledger: a signed checkpoint kept outside the database")
@click.option("--keyring", type=click.Path(dir_okay=False, path_type=Path),
              help="with --ledger: the public keys (default: the server's own key file)")
@store_options
def audit_verify(
    as_json: bool, ledger: bool, checkpoint: Path | None, keyring: Path | None
) -> None:
    """Replay every Task stream and compare with tasks_view; exit 1 on any disagreement.
    With --ledger, check the tamper-evident history instead (docs/auditing.md)."""
    from kandev_es.services.audit import verify_tasks

    services = open_store()
    try:
        if ledger:
            from kandev_es.cli_ledger import verify_ledger_command

            if not verify_ledger_command(services, checkpoint, keyring, as_json):
                raise SystemExit(1)
            return
        report = verify_tasks(services.app, services.database)
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        click.echo(
            f"audited {report.streams} task streams up to position {report.position}"
            f" against {report.rows} tasks_view rows: "
            + ("OK" if report.ok else f"{len(report.disagreements)} disagreement(s)")
        )
        for item in report.disagreements:
            detail = f" {json.dumps(item.detail, default=str)}" if item.detail else ""
            click.echo(f"  task {item.task_id}: {item.problem}{detail}")
    if not report.ok:
        raise SystemExit(1)


def register(main: click.Group, projections: click.Group) -> None:
    projections.add_command(projections_rebuild)
    identity = click.Group("identity", help="Identity streams (auditors).")
    identity.add_command(identity_history_command)
    audit = click.Group("audit", help="Read-model audits and tamper-evident history.")
    audit.add_command(audit_verify)
    from kandev_es.cli_ledger import register as register_ledger

    register_ledger(audit)  # audit checkpoint, keyring, consistency
    main.add_command(identity)
    main.add_command(audit)
