"""Tamper-evident history from the command line (docs/auditing.md):
``audit checkpoint``, ``audit keyring``, ``audit consistency``, and the parts
``audit verify --ledger`` and ``identity history --proof`` (cli_ops.py) and
``db init``'s backfill (cli.py) call. Registered on the ``audit`` group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kandev_es.cli_usage import open_store, store_options
from kandev_es.errors import KandevError


@click.command("checkpoint", short_help="Print the latest signed checkpoint (C2SP signed note).")
@click.option("--now", is_flag=True, help="log every settled event and sign a checkpoint first")
@store_options
def audit_checkpoint(now: bool) -> None:
    """Print the latest signed checkpoint of the Merkle log, a C2SP
    tlog-checkpoint in a signed note. Ship it outside the database's reach."""
    from kandev_es.services.ledger import latest_checkpoint

    services = open_store()
    try:
        if now:
            services.ledger.catch_up()
        click.echo(latest_checkpoint(services.database), nl=False)
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command("checkpoints", short_help="List the signed checkpoints' sizes.")
@click.option("--after", "after", type=click.IntRange(min=0), default=0, show_default=True,
              help="only checkpoints of sizes above this")
@click.option("--limit", type=click.IntRange(min=1, max=100_000), default=50,
              show_default=True, help="at most this many")
@click.option("--oldest", is_flag=True,
              help="the first --limit above --after (default: the newest --limit)")
@click.option("--json", "as_json", is_flag=True,
              help="print JSON: size, signed_at, origin, root and the signed note of each")
@store_options
def audit_checkpoints(after: int, limit: int, oldest: bool, as_json: bool) -> None:
    """List the signed checkpoints, by tree size: the sizes you may ask a
    consistency proof between (``audit consistency --from A --to B``,
    ``identity history --proof --consistency-from A``)."""
    from datetime import UTC, datetime

    from kandev_es.services.ledger import signed_checkpoints

    services = open_store()
    try:
        listed = signed_checkpoints(services.database, after, limit, newest=not oldest)
    finally:
        services.close()
    if as_json:
        click.echo(json.dumps({"checkpoints": listed}, indent=2))
        return
    if not listed:
        click.echo("no signed checkpoint" + (f" above size {after}" if after else ""))
        return
    click.echo(f"{'SIZE':>12}  {'SIGNED AT (UTC)':<20}  {'ROOT':<44}  ORIGIN")
    for item in listed:
        at = datetime.fromtimestamp(item["signed_at"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"{item['size']:>12}  {at:<20}  {item['root']:<44}  {item['origin']}")


@click.command("keyring", short_help="Print the public keyring that verifies checkpoints.")
@store_options
def audit_keyring() -> None:
    """Print the keyring (public key only) for kandev-es-verify and --keyring."""
    from kandev_es.cli_usage import store_settings
    from kandev_es.services.ledger_keys import load_keyring

    try:
        click.echo(load_keyring(store_settings()).to_json(), nl=False)
    except KandevError as error:
        raise click.ClickException(error.message) from None


@click.command("consistency", short_help="A consistency proof between two signed checkpoints.")
@click.option("--from", "old_size", type=click.IntRange(min=1), required=True,
              help="the older checkpoint's size")
@click.option("--to", "new_size", type=click.IntRange(min=1), default=None,
              help="the newer one's (default: latest)")
@store_options
def audit_consistency(old_size: int, new_size: int | None) -> None:
    """Print a consistency proof (JSON) that the log at --to extends the log at --from."""
    from kandev_es.services.ledger import consistency

    services = open_store()
    try:
        click.echo(json.dumps(consistency(services.database, old_size, new_size), indent=2))
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


def verify_ledger_command(
    services: Any, checkpoint: Path | None, keyring: Path | None, as_json: bool
) -> bool:
    """``audit verify --ledger``: prints the report; whether it is clean."""
    from kandev_es_client.signed_note import NoteError, parse_keyring

    from kandev_es.services.ledger_audit import describe, verify_ledger
    from kandev_es.services.ledger_keys import load_keyring

    try:
        ring = (parse_keyring(keyring.read_text(encoding="utf-8")) if keyring
                else load_keyring(services.settings))
        outside = checkpoint.read_text(encoding="utf-8") if checkpoint else None
    except (OSError, NoteError) as error:
        raise click.ClickException(str(error)) from None
    except KandevError as error:
        raise click.ClickException(error.message) from None
    report = verify_ledger(services.app, services.database, ring, outside)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else "\n".join(describe(report)))
    return report.ok


def backfill_ledger() -> str:
    """``db init`` on a store written before the ledger: log every event and
    sign a checkpoint (the sequencer would, at its own pace). A refusal to
    sign (services/ledger.py: a rewritten log, a lost key) fails db init loudly."""
    from kandev_es.errors import LedgerRefused
    from kandev_es.services.ledger import latest_checkpoint

    services = open_store()
    try:
        services.ledger.catch_up()
        services.ledger.fill_chains()
        size = latest_checkpoint(services.database).split("\n")[1]
    except LedgerRefused as error:
        raise click.ClickException(f"ledger: REFUSED to sign a checkpoint: {error.message}"
                                   ) from None
    except KandevError as error:  # an empty store: no checkpoint to name
        return f"ledger: nothing signed ({error.message})"
    finally:
        services.close()
    return f"ledger: {size} events in the log, checkpoint signed"


@click.command("reanchor", short_help="After a real restore: re-anchor the signer (logged).")
@click.option("--reason", required=True, help="why (the restore's ticket, who asked)")
@store_options
def audit_reanchor(reason: str) -> None:
    """After restoring the database from a backup on purpose, the log no
    longer extends the last checkpoint this host signed, and the sequencer
    refuses to sign. This makes the restored log the signer's anchor and
    prints a signed statement naming the old and the new root (kept beside
    the key too): publish it with your checkpoints, so auditors see the fork.
    When the log still extends that checkpoint it says so and changes
    nothing. Operators only: it needs the signing key's directory. See
    docs/operations.md, "Restoring the ledger"."""
    services = open_store()
    try:
        statement = services.ledger.reanchor(reason)
        if statement is None:
            click.echo("nothing to re-anchor: the log in the database extends the last"
                       " checkpoint this host signed (or it never signed one)", err=True)
        else:
            click.echo(statement, nl=False)
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command("rotate-key", short_help="Make a new signing key; record its window (logged).")
@store_options
def audit_rotate_key() -> None:
    """A new checkpoint signing key, for a lost or a retired one: the old
    key's window in the keyring closes at the largest checkpoint signed so
    far, the new key signs from the next size; the old key file is kept aside
    as ``<key>.retired-<id>``. Stop the servers first. Prints the keyring:
    give it to auditors. Operators only (docs/auditing.md, "Keys")."""
    from kandev_es.services.ledger import rotate_key

    services = open_store()
    try:
        click.echo(rotate_key(services.database, services.settings).to_json(), nl=False)
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command("task-proof", short_help="Print a task stream's proof bundle (kandev-es-verify).")
@click.option("--task-id", "task_id", type=click.UUID, required=True, help="the task's id")
@click.option("--consistency-from", "consistency_from", type=click.IntRange(min=1),
              multiple=True, metavar="SIZE",
              help="also prove the bundle's checkpoint extends your checkpoint of this size"
              " (repeatable)")
@store_options
def audit_task_proof(task_id: Any, consistency_from: tuple[int, ...]) -> None:
    """Print the proof bundle of a task's stream: its events as stored, their
    chain, their inclusion proofs and its head in the latest checkpoint's map
    of stream heads (so a deleted title change shows), for ``kandev-es-verify
    bundle``. Reads the store, like ``identity history --proof``."""
    from kandev_es.services.ledger import task_proof_bundle

    services = open_store()
    try:
        bundle = task_proof_bundle(services.app, services.database, task_id, consistency_from)
        click.echo(json.dumps(bundle, indent=2))
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@click.command("rebuild-heads", short_help="Rebuild the map of stream heads from the log (logged).")
@store_options
def audit_rebuild_heads() -> None:
    """When the sequencer refuses to sign because the map of stream heads'
    tables were changed: the next checkpoint builds the map again from the
    log's leaves (which the signer's anchor holds to what it signed), so it
    commits the log's own heads. Operators only (docs/auditing.md)."""
    from kandev_es.services.ledger_heads import rebuild

    services = open_store()
    try:
        size = rebuild(services.database)
    finally:
        services.close()
    click.echo(f"the map of stream heads (it described the log at size {size}) will be built"
               " again from the log at the next checkpoint")


def register(audit: click.Group) -> None:
    for command in (audit_checkpoint, audit_checkpoints, audit_keyring, audit_consistency,
                    audit_reanchor, audit_rotate_key, audit_rebuild_heads, audit_task_proof):
        audit.add_command(command)
