"""``kandev-es webhook``: subscriptions of a workspace (create, list, get,
pause, resume, delete, rotate-secret, replay, deliveries), the server's v1a
public key, and ``deliver``, the deliverer as a process of its own
(docs/webhooks.md). Registered on the ``kandev-es`` group by cli.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kandev_es.cli_usage import UUID_ARGUMENT, open_store, store_options, workspace_id
from kandev_es.errors import KandevError

if TYPE_CHECKING:  # the store's modules load when a command opens it, not for --help
    from kandev_es.bootstrap import Services


def _emit(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, default=str))


def _run(work: Callable[[Services], Any]) -> None:
    """``work`` over the store; a typed refusal is one line and exit 1."""
    services = open_store()
    try:
        work(services)
    except KandevError as error:
        raise click.ClickException(f"{error.code}: {error.message}") from None
    finally:
        services.close()


WORKSPACE = click.option("--workspace", required=True, help="workspace id or name")


@click.command("create")
@WORKSPACE
@click.option("--url", required=True, help="https URL the events are POSTed to")
@click.option(
    "--event-type",
    "event_types",
    multiple=True,
    required=True,
    help="task.created or task.updated (repeat for both)",
)
@click.option("--description", default="", help="free text to recognise it by")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=None,
    help="feed position to start after [default: the feed's head]",
)
@store_options
def create(
    workspace: str, url: str, event_types: tuple[str, ...], description: str, after: int | None
) -> None:
    """Subscribe URL to the workspace's feed; prints the secret (shown once)."""

    def work(services: Services) -> None:
        dto, secret = services.webhooks.service.create(
            workspace_id(services, workspace), url, list(event_types), description, after
        )
        _emit({**dto, "secret": secret})

    _run(work)


@click.command("list")
@WORKSPACE
@store_options
def list_(workspace: str) -> None:
    """The workspace's subscriptions, one JSON line each (never a secret)."""

    def work(services: Services) -> None:
        found = services.webhooks.service.list(workspace_id(services, workspace))
        for dto in found:
            _emit(dto)
        click.echo(f"webhooks: {len(found)} subscriptions")

    _run(work)


def _by_id(name: str, summary: str) -> click.Command:
    """``webhook NAME --workspace W ID``: the service's method of that name."""

    @click.command(name, help=summary)
    @WORKSPACE
    @click.argument("webhook_id", type=UUID_ARGUMENT)
    @store_options
    def command(workspace: str, webhook_id: uuid.UUID) -> None:
        def work(services: Services) -> None:
            method = getattr(services.webhooks.service, name)
            _emit(method(workspace_id(services, workspace), webhook_id))

        _run(work)

    return command


@click.command("replay")
@WORKSPACE
@click.argument("webhook_id", type=UUID_ARGUMENT)
@click.option(
    "--after",
    type=click.IntRange(min=0),
    required=True,
    help="feed cursor: every event after it is delivered again, in order",
)
@store_options
def replay(workspace: str, webhook_id: uuid.UUID, after: int) -> None:
    """Deliver WEBHOOK_ID's events again from a feed position (refused while paused)."""

    def work(services: Services) -> None:
        _emit(
            services.webhooks.service.replay(workspace_id(services, workspace), webhook_id, after)
        )

    _run(work)


@click.command("rotate-secret")
@WORKSPACE
@click.argument("webhook_id", type=UUID_ARGUMENT)
@click.option(
    "--overlap",
    type=click.FloatRange(min=0, max=30 * 86400),
    default=None,
    help="seconds the old secret keeps signing [default: 86400]",
)
@store_options
def rotate_secret(workspace: str, webhook_id: uuid.UUID, overlap: float | None) -> None:
    """A new secret for WEBHOOK_ID (shown once); the old one signs beside it for the
    overlap."""

    def work(services: Services) -> None:
        dto, secret = services.webhooks.service.rotate_secret(
            workspace_id(services, workspace), webhook_id, overlap
        )
        _emit({**dto, "secret": secret})

    _run(work)


@click.command("deliveries")
@WORKSPACE
@click.argument("webhook_id", type=UUID_ARGUMENT)
@click.option(
    "--limit", type=click.IntRange(1, 100), default=20, show_default=True, help="how many attempts"
)
@store_options
def deliveries(workspace: str, webhook_id: uuid.UUID, limit: int) -> None:
    """The delivery log of WEBHOOK_ID: the latest attempts, newest first, one JSON
    line each, then where the subscription stands."""

    def work(services: Services) -> None:
        found = services.webhooks.service.deliveries(
            workspace_id(services, workspace), webhook_id, limit
        )
        for item in found["items"]:
            _emit(item)
        s = found["subscription"]
        reason = f" ({s['disabled_reason']})" if s["disabled_reason"] else ""
        click.echo(
            f"webhook {s['id']}: {s['state']}{reason}, cursor {s['cursor']},"
            f" {s['attempts']} failed attempts of the next event"
        )

    _run(work)


@click.command("public-key")
@store_options
def public_key() -> None:
    """The server's v1a public key (whpk_...), for receivers."""
    _run(lambda services: click.echo(services.webhooks.public_key()))


@click.command("rotate-key", short_help="Make a new v1a signing key (the old one overlaps).")
@click.option(
    "--overlap",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="how long the old key signs beside the new one (default"
    " KANDEV_WEBHOOK_SECRET_OVERLAP, 24 h; 0: it stops now)",
)
@store_options
def rotate_key(overlap: float | None) -> None:
    """A new Ed25519 key signs every webhook's v1a entry from now on; the old
    one signs beside it for the overlap, so receivers verify with the published
    keyring alone while they fetch the new key. Running processes sign with it
    within a second; copy the key file to every other node's
    KANDEV_WEBHOOK_KEY_FILE within the overlap. Prints the keyring (JSON)."""
    _run(lambda services: _emit({"keys": services.webhooks.rotate_key(overlap)}))


@click.command("deliver")
@store_options
def deliver() -> None:
    """Run the deliverer alone (a process of its own beside the server; with
    KANDEV_WEBHOOKS_IN_PROCESS=0 the server's background process leaves
    delivery to it). One process per database delivers at a time; the others
    wait to take over."""
    services = open_store()
    try:
        services.webhooks.deliverer().run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        services.close()


def register(main: click.Group) -> None:
    group = click.Group("webhook", help="Webhook subscriptions and their delivery (operators).")
    commands = (create, list_, replay, rotate_secret, rotate_key, deliveries, public_key, deliver)
    for command in commands:
        group.add_command(command)
    group.add_command(_by_id("get", "Subscription WEBHOOK_ID, as JSON (never its secret)."))
    group.add_command(_by_id("pause", "Stop delivering to WEBHOOK_ID; its cursor stays."))
    group.add_command(
        _by_id("resume", "Deliver to WEBHOOK_ID again from its cursor; re-enables a disabled one.")
    )
    group.add_command(_by_id("delete", "Delete WEBHOOK_ID, its secret and its log."))
    main.add_command(group)
