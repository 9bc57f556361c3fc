"""Every command and every visible option of `kandev-es` says what it is for:
docs/cli.md is generated from them (mkdocs-click), so a missing help text is a
hole in the reference."""

from __future__ import annotations

from collections.abc import Iterator

import click

from kandev_es.cli import main


def commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text():
    missing = []
    for path, command in commands(main, "kandev-es"):
        if not (command.help or "").strip():
            missing.append(path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                missing.append(f"{path} {'/'.join(param.opts)}")
            if isinstance(param, click.Argument):  # click has no help for arguments
                assert param.human_readable_name in (command.help or ""), (path, param.name)
    assert missing == []


def test_the_command_line_imports_no_store_server_or_renderer_until_a_command_runs():
    """Every `kandev-es` start imports kandev_es.cli: --help, a usage error and
    a command that fails its options must not pay for the store, the server,
    the client or rich (0.8 s of imports before they were imported lazily)."""
    import subprocess
    import sys

    script = "import sys, kandev_es.cli; print('\\n'.join(sorted(sys.modules)))"
    loaded = set(subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split())
    assert "kandev_es.cli_tasks" in loaded  # every command is registered
    heavy = ("kandev_es.bootstrap", "kandev_es.application", "kandev_es.server",
             "kandev_es.storage", "kandev_es.creation", "kandev_es.bulk", "kandev_es_client",
             "eventsourcing", "psycopg", "marshmallow", "flask", "httpx", "rich")
    assert sorted(name for name in loaded if name.split(".")[0] in heavy
                  or name.startswith(heavy)) == []
