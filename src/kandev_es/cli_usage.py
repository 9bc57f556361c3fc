"""CLI manners shared by every command: a usage error is one line on stderr
and exit 2 (never click's usage block, never a traceback), any other error one
line and exit 1; option values are checked before anything starts (a port out
of range, no workers, a host that does not resolve); a command that opens the
store takes --data-dir / --database-url, names the store it uses on stderr and
refuses a place where there is none."""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import NoArgsIsHelpError

from kandev_es.config import Settings, load_settings, postgres_target
from kandev_es.errors import InvalidSetting, KandevError
from kandev_es.limits import unstorable

if TYPE_CHECKING:  # the store's modules load when a command opens it, not for --help
    from kandev_es.bootstrap import Services


class _Int(click.IntRange):
    name = "integer"  # "'abc' is not a valid integer", as for a plain int


class _Float(click.FloatRange):
    name = "float"


PORT = _Int(1, 65535)
AT_LEAST_ONE = _Int(min=1)
SECONDS = _Float(min=0, min_open=True)


def resolvable_host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An address to listen on must resolve, or the server would retry and fail late."""
    try:
        socket.getaddrinfo(value, None)
    except (OSError, UnicodeError):
        raise click.BadParameter(f"{value!r} is not an address or a known host name") from None
    return value


def require_free_address(host: str, port: int) -> None:
    """The server can listen on ``host``:``port`` (bound as it binds: with
    SO_REUSEADDR), checked before anything starts; else one line naming the
    address and exit 1 (gunicorn would retry for 5 s, then name no reason)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = error.strerror or str(error)
        raise click.ClickException(f"cannot listen on {where}: {reason}") from None


class OneLineUsage(click.Group):
    """The top-level group: click's own handling, except that a usage error
    prints a single ``Error: …`` line naming the command's --help."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        extra.pop("standalone_mode", None)
        _check_arguments(sys.argv[1:] if args is None else args)
        try:
            result = super().main(args, prog_name, standalone_mode=False, **extra)
        except NoArgsIsHelpError as error:  # a bare group: its help, as click shows it
            error.show()
            sys.exit(error.exit_code)
        except click.UsageError as error:
            where = error.ctx.command_path if error.ctx is not None else "kandev-es"
            click.echo(f"Error: {error.format_message()} (see '{where} --help')", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except KandevError as error:  # e.g. an unreachable database: one line, no traceback
            click.echo(f"Error: {' '.join(error.message.split())}", err=True)
            sys.exit(1)
        # Without standalone mode click returns --help's exit code or the callback's value.
        sys.exit(result if isinstance(result, int) else 0)


def _check_arguments(args: Sequence[str]) -> None:
    """Every argument is text a store can hold, checked once before any
    command runs (the CLI's edge, as limits.parse_json_body is the API's): a
    non-UTF-8 byte in argv arrives as a lone surrogate (surrogateescape), which
    would fail with a traceback wherever it is first encoded."""
    for position, argument in enumerate(args, start=1):
        if unstorable(argument) is not None:
            click.echo(
                f"Error: argument {position} is not valid UTF-8 text (see 'kandev-es --help')",
                err=True,
            )
            sys.exit(2)


# --- Which store a command uses -------------------------------------------------------

_STORE = "kandev_es.store"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None and param.name is not None:
        ctx.meta.setdefault(_STORE, {})[param.name] = value
    return value


def _postgres_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("not a postgresql:// URL")
    if value is not None:
        try:
            postgres_target(value)  # what KANDEV_DATABASE_URL would be refused for
        except InvalidSetting as error:
            raise click.BadParameter(error.message) from None
    _remember(ctx, param, value)
    return value


def store_options(command: Any) -> Any:
    """``--data-dir`` and ``--database-url`` on a command that opens the store;
    given, they take the place of KANDEV_DATA_DIR and KANDEV_DATABASE_URL."""
    command = click.option(
        "--database-url",
        metavar="URL",
        default=None,
        expose_value=False,
        callback=_postgres_url,
        help="PostgreSQL store [default: KANDEV_DATABASE_URL; prefer the variable for a URL "
        "with a password, a command line is visible to other users]",
    )(command)
    return click.option(
        "--data-dir",
        metavar="DIR",
        default=None,
        expose_value=False,
        type=click.Path(file_okay=False, path_type=Path),
        callback=_remember,
        help="data directory (the SQLite store, worktrees, agent logs, metrics) "
        "[default: KANDEV_DATA_DIR, else ./.kandev-es]",
    )(command)


def store_settings(**overrides: Any) -> Settings:
    """The settings with the command's --data-dir / --database-url applied."""
    chosen = click.get_current_context().meta.get(_STORE, {})
    return load_settings().with_overrides(**chosen, **overrides)


def name_store(settings: Settings) -> None:
    """One line on stderr naming the store (a PostgreSQL password masked), so
    output is never mistaken for another store's."""
    click.echo(f"kandev-es: {settings.backend} store {settings.location}", err=True)


def open_store(create_tables: bool = False) -> Services:
    """The services over an existing store, named on stderr. A place with no
    store is one line and exit 1, and nothing is created there."""
    from kandev_es.bootstrap import bootstrap

    return bootstrap(existing_store(create_tables))


def existing_store(create_tables: bool = False) -> Settings:
    """The settings of an existing store, named on stderr (``open_store``
    without opening it)."""
    from kandev_es.bootstrap import store_exists

    settings = store_settings(create_tables=create_tables)
    if not store_exists(settings):
        raise click.ClickException(
            f"no kandev-es store at {settings.location}: point at one with --data-dir or "
            "KANDEV_DATA_DIR (--database-url or KANDEV_DATABASE_URL for PostgreSQL), "
            "or create one with 'kandev-es db init'"
        )
    name_store(settings)
    return settings


class _Uuid(click.types.UUIDParameterType):
    """An id argument: a UUID, or the one-line usage error 'not a UUID'."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            hint = param.human_readable_name if param is not None else None
            raise click.BadParameter("not a UUID", ctx=ctx, param_hint=hint) from None


UUID_ARGUMENT = _Uuid()


def workspace_id(services: Services, value: str) -> uuid.UUID:
    """``--workspace`` as an id or a name (a name is the current workspace of that name)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        workspace = services.workspaces.get_by_name(value)
        if workspace is None:
            raise click.BadParameter(f"no workspace {value!r}", param_hint="--workspace") from None
        return workspace.id
