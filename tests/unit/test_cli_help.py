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
