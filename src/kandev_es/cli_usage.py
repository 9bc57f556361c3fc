"""CLI manners shared by every command: a usage error is one line on stderr
and exit 2 (never click's usage block, never a traceback), and option values
are checked before anything starts (a port out of range, no workers, a host
that does not resolve)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from typing import Any

import click
from click.exceptions import NoArgsIsHelpError


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


class OneLineUsage(click.Group):
    """The top-level group: click's own handling, except that a usage error
    prints a single ``Error: …`` line naming the command's --help."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        extra.pop("standalone_mode", None)
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
        # Without standalone mode click returns --help's exit code or the callback's value.
        sys.exit(result if isinstance(result, int) else 0)
