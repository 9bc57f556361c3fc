"""The `kandev-es` command: serve, db init, workspaces, tokens, projections.

Every `kandev-es` start imports this module and the cli_* modules it registers:
they import only click, the settings and the error types at the top; a command
imports the store, the server or rich when it runs (`kandev-es --help` and a
usage error load none of them)."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from typing import Any

import click

from kandev_es import __version__
from kandev_es.cli_agentctl import register as register_agentctl
from kandev_es.cli_import import register as register_import
from kandev_es.cli_ledger import backfill_ledger
from kandev_es.cli_numbers import register as register_numbers
from kandev_es.cli_ops import register as register_ops
from kandev_es.cli_parked import register as register_parked
from kandev_es.cli_tasks import register as register_tasks
from kandev_es.cli_usage import (
    AT_LEAST_ONE,
    PORT,
    SECONDS,
    UUID_ARGUMENT,
    OneLineUsage,
    existing_store,
    name_store,
    open_store,
    require_free_address,
    resolvable_host,
    store_options,
    store_settings,
    workspace_id,
)
from kandev_es.cli_webhooks import register as register_webhooks
from kandev_es.config import load_settings, local_url
from kandev_es.errors import InvalidSetting, KandevError
from kandev_es.observability import logs


def _emit(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, default=str))


def _global_option(value: str | None, option: str) -> None:
    if value is not None:
        raise click.UsageError(
            f"{option} is a global option: kandev-es {option} {value} serve"
        )


class SettingError(click.ClickException):
    """A bad environment setting: a usage error (exit 2), one line."""

    exit_code = 2


@click.group(cls=OneLineUsage, context_settings={"max_content_width": 100})
@click.version_option(
    __version__, "--version", prog_name="kandev-es", message="%(prog)s %(version)s"
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="default from KANDEV_LOG_LEVEL, else WARNING (INFO for serve and background)",
)
@click.pass_context
def main(ctx: click.Context, log_level: str | None) -> None:
    """kandev-es: idempotent task creation by external ID.

    Commands that use the store take --data-dir / --database-url (default
    KANDEV_DATA_DIR / KANDEV_DATABASE_URL), name it on stderr, and refuse a place
    with no store (only db init and serve create one)."""
    try:
        settings = load_settings()  # every command reads it: bad values fail here, once
    except InvalidSetting as error:
        raise SettingError(error.message) from None
    # One-shot commands stay quiet unless asked; the server logs its operation.
    quiet = "INFO" if ctx.invoked_subcommand in ("serve", "background") else "WARNING"
    level = log_level or settings.log_level or quiet
    # Text or JSON lines (KANDEV_LOG_FORMAT), redacted, with each request's id.
    logs.configure(level, settings.log_format)


@main.group()
def db() -> None:
    """Database administration."""


@db.command("init", short_help="Create the event store and read-model tables.")
@store_options
def db_init() -> None:
    """Create the event store and read-model tables (once, before workers start;
    again after an upgrade: it is idempotent). On PostgreSQL a second line says
    whether a commit waits for a synchronous standby."""
    from kandev_es.bootstrap import init_storage, store_exists

    settings = store_settings()
    store_exists(settings)  # an unreachable database: one line, before any pool retries
    found = init_storage(settings)
    click.echo(f"initialised {settings.backend}: {settings.location}")
    if found is not None:  # PostgreSQL: would a commit survive losing this primary?
        click.echo(found.describe())
    click.echo(backfill_ledger())  # chains and the Merkle log for every event already stored


@main.group()
def workspace() -> None:
    """Workspaces: create, list."""


@workspace.command("create")
@click.argument("name")
@click.option(
    "--prefix", "task_prefix", default="KAN", show_default=True,
    help="prefix of its tasks' office identifiers (PAY makes PAY-1, PAY-2, ...)",
)
@store_options
def workspace_create(name: str, task_prefix: str) -> None:
    """Create a workspace named NAME and print it as JSON."""
    services = open_store()
    try:
        created = services.workspaces.open(name, task_prefix)
        _emit({"id": created.id, "name": created.name, "task_prefix": created.task_prefix})
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@main.group()
def token() -> None:
    """API tokens (printed once, stored hashed)."""


@token.command("create")
@click.option("--workspace", "workspace", default=None, help="workspace (id or name) it acts on")
@click.option("--admin", is_flag=True, help="an admin token acting on every workspace")
@click.option("--label", default="", help="free text to recognise the token by")
@click.option(
    "--role", type=click.Choice(["member", "operator"]), default="member",
    help="workspace tokens: member (tasks, feeds) or operator (adds release, "
    "repositories, policy, workspace deletion)",
)
@store_options
def token_create(workspace: str | None, admin: bool, label: str, role: str) -> None:
    """Issue a token and print it once as JSON, with its id (what revoke takes)."""
    if admin == (workspace is not None):
        raise click.UsageError("give exactly one of --workspace or --admin")
    services = open_store()
    try:
        target = None
        if workspace is not None:
            target = workspace_id(services, workspace)
            if services.workspaces.get(target) is None:
                raise click.ClickException(f"no workspace {workspace}")
        secret, issued = services.tokens.issue(
            workspace_id=target, admin=admin, label=label, role=role
        )
        _emit({"id": str(issued.token_id), "token": secret})  # the id is what revoke takes
    finally:
        services.close()


@token.command("list")
@store_options
def token_list() -> None:
    """Print every token as JSON lines (id, role, workspace, created, revoked)."""
    services = open_store()
    try:
        for listed in services.tokens.list_tokens():
            _emit(listed)
    except KandevError as error:
        raise click.ClickException(error.message) from None
    finally:
        services.close()


@token.command("revoke")
@click.argument("token_id", type=UUID_ARGUMENT)
@store_options
def token_revoke(token_id: uuid.UUID) -> None:
    """Revoke the token TOKEN_ID (its id, as `token list` shows); it is refused
    from its next request."""
    services = open_store()
    try:
        _emit(services.tokens.revoke(token_id))
    except KandevError as error:
        raise click.ClickException(f"{error.message}: {token_id}") from None
    finally:
        services.close()


@main.group()
def projections() -> None:
    """Read-model projections."""


@projections.command("run", short_help="Run the projection loop beside the web workers.")
@click.option("--once", is_flag=True, help="catch up and exit")
@store_options
def projections_run(once: bool) -> None:
    """Run the projection loop (a separate process beside the web workers)."""
    services = open_store()
    try:
        if once:
            read = services.projections.catch_up()
            count = len(services.projections.projections)
            click.echo(f"projections caught up: {read} events processed by {count} projections")
        else:
            services.projections.run_forever(services.settings.projection_poll_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        services.close()


@main.command()
@click.option("--workspace", required=True, help="workspace id or name")
@click.option("--external-id", required=True, help="the external ID whose holder is released")
@click.option("--operation-id", required=True, help="stable id: a replay returns the same result")
@store_options
def release(workspace: str, external_id: str, operation_id: str) -> None:
    """Operator release: free an identity without deleting its task.

    A manual decision for an abandoned task, never an automatic recovery step:
    releasing an identity another create is still using re-opens duplicates."""
    services = open_store()
    try:
        target = workspace_id(services, workspace)
        # The local CLI reaches the store directly: no token, so the actor is "cli".
        result = services.release.release(target, external_id, operation_id, actor="cli")
        if not result.released:  # the operation is recorded: a replay answers the same
            replay = " (replayed)" if result.replayed else ""
            raise click.ClickException(
                f"{result.body.get('error', 'task not found')}: no task holds "
                f"{external_id!r} in workspace {target}{replay}"
            )
        # "status" is what REST answers for the same release.
        _emit({"status": 200, "replayed": result.replayed, **result.body})
    except KandevError as error:
        raise click.ClickException(f"{error.code}: {error.message}") from None
    finally:
        services.close()


@main.command(short_help="Run the fenced recovery Runtime (finish or abort orphaned creations).")
@click.option("--once", is_flag=True, help="one recovery scan, then exit")
@click.option(
    "--poll", default=1.0, show_default=True, type=SECONDS, help="seconds between scans"
)
@click.option(
    "--parked",
    is_flag=True,
    help="list the creations the Runtime parked, then exit (settle them with"
    " 'kandev-es creations retry|abort')",
)
@store_options
def runtime(once: bool, poll: float, parked: bool) -> None:
    """Run the fenced recovery Runtime: finish or abort creations whose owner died."""
    services = open_store()
    actor = services.runtime()
    try:
        if parked:
            left = actor.parked()
            for creation in left:
                _emit(
                    {
                        "identity_id": creation.identity_id,
                        "tenure": creation.tenure,
                        "workspace_id": creation.workspace_id,
                        "task_id": creation.task_id,
                        "phase": creation.phase,
                        "epoch": creation.epoch,
                        "reason": creation.reason,
                    }
                )
            click.echo(f"runtime: {len(left)} creations parked")
        elif once:
            recoveries = actor.recover_once()
            actor.revoke_exited_agents()
            for recovery in recoveries:
                _emit(
                    {
                        "identity_id": recovery.identity_id,
                        "tenure": recovery.tenure,
                        "epoch": recovery.epoch,
                        "phase": recovery.phase,
                    }
                )
            phases = Counter(recovery.phase for recovery in recoveries)
            detail = ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))
            summary = f"runtime: {len(recoveries)} creations settled"
            click.echo(summary + (f" ({detail})" if detail else ""))
        else:
            actor.run_forever(poll)
    except KeyboardInterrupt:
        pass
    finally:
        services.close()


@main.command(short_help="Run the background work: projections, ledger, Runtime, webhooks.")
@click.option(
    "--agent-api-url", metavar="URL", default=None,
    help="the API's URL for the agents the Runtime launches [default: from KANDEV_BIND, else"
    " http://127.0.0.1:8000]",
)
@click.option(
    "--metrics-port", type=PORT, default=None,
    help="serve this process's metrics at http://127.0.0.1:PORT/metrics (run apart from a"
    " server, whose /metrics does not include it)",
)
@click.option("--parent", type=click.IntRange(min=1), default=None, hidden=True,
              help="stop once the process with this pid is no longer the parent")
@store_options
def background(agent_api_url: str | None, metrics_port: int | None, parent: int | None) -> None:
    """Run the node's background work in this process until SIGTERM: the
    projection loop, the ledger sequencer, the recovery Runtime (unless
    KANDEV_RUNTIME_IN_PROCESS=n) and the webhook deliverer (unless
    KANDEV_WEBHOOKS_IN_PROCESS=false). `serve` starts one itself; run this one
    (e.g. under systemd) beside web workers started with KANDEV_BACKGROUND=external.
    Each loop leads by a lock of its own: any number of these processes
    work as one per database. Logs at INFO."""
    from kandev_es.background.process import run

    if metrics_port is not None:
        require_free_address("127.0.0.1", metrics_port)
    settings = existing_store()
    if agent_api_url:
        settings = settings.with_overrides(agent_api_url=agent_api_url)
    run(settings, parent, metrics_port)


@main.command(short_help="Run the API (embedded SQLite; PostgreSQL with KANDEV_DATABASE_URL).")
@click.option(
    "--host", default="127.0.0.1", show_default=True, callback=resolvable_host,
    help="address to listen on (0.0.0.0: every interface)",
)
@click.option("--port", default=8000, show_default=True, type=PORT, help="port to listen on")
@click.option(
    "--workers",
    default=None,
    type=AT_LEAST_ONE,
    show_default="1 on SQLite, 2 on PostgreSQL",
    help="web worker processes",
)
@click.option(
    "--threads", default=8, show_default=True, type=AT_LEAST_ONE, help="request threads per worker"
)
@click.option(
    "--log-level",
    "misplaced_log_level",
    hidden=True,
    default=None,
    expose_value=False,
    callback=lambda ctx, param, value: _global_option(value, "--log-level"),
)
@store_options
def serve(host: str, port: int, workers: int | None, threads: int) -> None:
    """Run the API (embedded SQLite by default; PostgreSQL with KANDEV_DATABASE_URL).

    Creates the store on first start; on an empty store also a `default` workspace
    and an admin token, printed once (with KANDEV_LOG_FORMAT=json no token: make one
    with `kandev-es token create --admin`). Logs at INFO; another level is the
    global option:

    \b
      kandev-es --log-level debug serve
    """
    from kandev_es.bootstrap import init_storage
    from kandev_es.server import first_start, run_server, served_at

    require_free_address(host, port)  # before the store and the first-start token
    settings = store_settings()
    found = init_storage(settings)  # in the parent, before any worker starts
    name_store(settings)
    if found is not None:
        logging.getLogger("kandev_es").log(
            logging.INFO if found.durable else logging.WARNING, "store %s", found.describe())
    first_start(settings, host, port)
    # Agents call the API where this server listens (not KANDEV_PUBLIC_URL).
    listening = settings.with_overrides(create_tables=False, agent_api_url=local_url(host, port))
    with served_at(settings, local_url(host, port)):
        run_server(listening, host, port, workers, threads)


@main.command("mcp", short_help="Run the MCP server (stdio, or streamable HTTP with --http).")
@click.option("--http", "over_http", is_flag=True, help="streamable HTTP instead of stdio")
@click.option(
    "--host", default="127.0.0.1", show_default=True, callback=resolvable_host, help="with --http"
)
@click.option("--port", default=8765, show_default=True, type=PORT, help="with --http")
@store_options
def mcp_server(over_http: bool, host: str, port: int) -> None:
    """Run the MCP server. stdio acts with the token in KANDEV_TOKEN; --http with
    each request's Authorization: Bearer header (endpoint /mcp, POST only, no
    sessions; a request without a valid token is 401 before anything is kept)."""
    from kandev_es.bootstrap import bootstrap
    from kandev_es.config import take_mcp_token
    from kandev_es.mcp.server import serve_stdio
    from kandev_es.mcp_http import serve as serve_http

    if over_http:
        require_free_address(host, port)  # before the store is opened or created
    token = take_mcp_token()
    settings = store_settings(create_tables=True)
    services = bootstrap(settings)
    name_store(settings)
    try:
        if over_http:
            serve_http(services, host, port)
        else:
            serve_stdio(services, token)
    except KeyboardInterrupt:
        pass
    finally:
        services.close()


# projections rebuild, identity history, audit verify (operator/auditor tools)
register_ops(main, projections)
register_parked(main)
register_agentctl(main)  # agentctl task create (inside an agent run)
register_tasks(main, workspace)  # workspace list, task create/get/lookup (for people)
register_import(main)  # task import (cli_import.py)
register_numbers(workspace)  # workspace advance-numbers (after a dump restore)
register_webhooks(main)  # webhook create/list/.../deliver (docs/webhooks.md)


def _whole_summaries(group: click.Group) -> None:
    """Give every command without a short_help its help's first paragraph, so
    --help lists whole summaries (click otherwise cuts them off with "...")."""
    for command in group.commands.values():
        if command.short_help is None and command.help:
            command.short_help = " ".join(command.help.split("\n\n", 1)[0].split())
        if isinstance(command, click.Group):
            _whole_summaries(command)


_whole_summaries(main)

if __name__ == "__main__":  # pragma: no cover
    main()
