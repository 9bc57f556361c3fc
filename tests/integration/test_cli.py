"""The operator CLI: workspaces and tokens print JSON; tokens work once issued."""

from __future__ import annotations

import json
import uuid

from kandev_es.bootstrap import bootstrap


def test_db_init_then_workspace_create_prints_json(cli):
    assert cli("db", "init").exit_code == 0
    result = cli("workspace", "create", "payments", "--prefix", "PAY")
    assert result.exit_code == 0, result.output
    workspace = json.loads(result.stdout.strip().splitlines()[-1])
    assert workspace["name"] == "payments" and workspace["task_prefix"] == "PAY"
    uuid.UUID(workspace["id"])


def test_duplicate_workspace_name_is_an_error(cli):
    assert cli("workspace", "create", "dup").exit_code == 0
    again = cli("workspace", "create", "dup")
    assert again.exit_code != 0
    assert "already exists" in again.output


def test_token_create_for_workspace_and_admin(cli, settings):
    workspace = json.loads(cli("workspace", "create", "ops").stdout.strip().splitlines()[-1])
    member = json.loads(cli("token", "create", "--workspace", workspace["id"]).stdout.strip())
    admin = json.loads(cli("token", "create", "--admin").stdout.strip())
    services = bootstrap(settings)
    try:
        who = services.tokens.authenticate(member["token"])
        assert who is not None and not who.admin
        assert str(who.workspace_id) == workspace["id"]
        boss = services.tokens.authenticate(admin["token"])
        assert boss is not None and boss.admin
    finally:
        services.close()


def test_token_create_needs_exactly_one_target(cli):
    assert cli("token", "create").exit_code != 0
    assert cli("token", "create", "--admin", "--workspace", str(uuid.uuid4())).exit_code != 0
    unknown = cli("token", "create", "--workspace", str(uuid.uuid4()))
    assert unknown.exit_code != 0 and "no workspace" in unknown.output
    assert cli("token", "create", "--workspace", "nope").exit_code != 0


def test_invalid_workspace_name_is_refused(cli):
    result = cli("workspace", "create", "bad name!")
    assert result.exit_code != 0


def test_bad_log_level_is_a_one_line_usage_error(tmp_path):
    import subprocess

    from kandev_es.config import Settings
    from tests.support.served import environment, kandev_command

    result = subprocess.run(
        [*kandev_command(), "--log-level", "LOUD", "db", "init"],
        env=environment(Settings(data_dir=tmp_path / "data")),
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: Invalid value for '--log-level': 'LOUD'"), line
    assert result.stdout == ""


def _run(settings, *args: str, **extra: str):
    """The real `kandev-es` in a subprocess, on ``settings``' backend."""
    import subprocess

    from tests.support.served import environment, kandev_command

    return subprocess.run(
        [*kandev_command(), *args],
        env=environment(settings, COLUMNS="80", **extra),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )


def test_help_shows_whole_summaries(tmp_path):
    from kandev_es.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    groups = [(), ("db",), ("projections",), ("identity",), ("audit",), ("agentctl",),
              ("agentctl", "task"), ("token",), ("workspace",)]
    for group in groups:
        result = _run(settings, *group, "--help")
        assert result.returncode == 0, result.stderr
        assert "Commands:" in result.stdout
        assert "..." not in result.stdout.split("Commands:", 1)[1], (group, result.stdout)


def test_db_init_prints_backend_and_location_without_secrets(settings):
    result = _run(settings, "db", "init")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    if settings.database_url:
        from urllib.parse import urlsplit

        password = urlsplit(settings.database_url).password
        assert line.startswith("initialised postgres: postgresql://")
        assert password is None or password not in result.stdout + result.stderr
        assert urlsplit(settings.database_url).hostname in line
    else:
        assert line == f"initialised sqlite: {settings.sqlite_path.resolve()}"


def test_commands_are_quiet_unless_asked(settings):
    assert _run(settings, "db", "init").returncode == 0
    quiet = _run(settings, "workspace", "create", "hush")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    loud = _run(settings, "--log-level", "info", "workspace", "create", "loud")
    assert loud.returncode == 0 and "INFO kandev_es schema attested" in loud.stderr


def test_once_commands_print_a_one_line_summary(settings):
    assert _run(settings, "db", "init").returncode == 0
    assert _run(settings, "workspace", "create", "summary").returncode == 0
    projected = _run(settings, "projections", "run", "--once")
    assert projected.returncode == 0, projected.stderr
    [line] = projected.stdout.splitlines()
    assert line.startswith("projections caught up: ") and "events processed" in line
    recovered = _run(settings, "runtime", "--once")
    assert recovered.returncode == 0, recovered.stderr
    assert recovered.stdout.splitlines() == ["runtime: 0 creations settled"]


def test_bad_numeric_setting_is_a_one_line_usage_error(settings):
    for name in ("KANDEV_POOL_SIZE", "KANDEV_LEASE_SECONDS"):
        result = _run(settings, "db", "init", **{name: "abc"})
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"Error: {name} must be {'an integer' if 'POOL' in name else 'a number'}, got 'abc'"
        ]
        assert result.stdout == ""
    # nothing was created: the failure came before any storage was touched
    assert not settings.sqlite_path.exists() or settings.database_url


BAD_VALUES = [
    (("serve", "--port", "abc"), "--port", "'abc' is not a valid integer"),
    (("serve", "--port", "70000"), "--port", "70000 is not in the range 1<=x<=65535"),
    (("serve", "--workers", "0"), "--workers", "0 is not in the range x>=1"),
    (("serve", "--threads", "-1"), "--threads", "-1 is not in the range x>=1"),
    (("serve", "--host", "no such host!"), "--host", "is not an address or a known host name"),
    (("mcp", "--port", "0"), "--port", "0 is not in the range"),
    (("runtime", "--poll", "0"), "--poll", "0.0 is not in the range x>0"),
    (("runtime", "--poll", "soon"), "--poll", "'soon' is not a valid float"),
    (("projections", "rebuild", "--batch-size", "0"), "--batch-size", "not in the range x>=1"),
    (("token", "create", "--admin", "--role", "boss"), "--role", "'boss' is not one of"),
    (("token", "revoke", "not-a-uuid"), "TOKEN_ID", "not a UUID"),
    (("release", "--workspace", "W"), "--external-id", "Missing option"),
    (("serve", "--bogus"), "--bogus", "No such option"),
    (("nope",), "nope", "No such command"),
]


def test_every_bad_option_value_is_a_one_line_usage_error_that_starts_nothing(tmp_path):
    """Exit 2, one line on stderr naming the option and the
    command's --help, nothing on stdout, no traceback, nothing initialised."""
    from kandev_es.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    for args, option, says in BAD_VALUES:
        result = _run(settings, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stdout == "", args
        [line] = result.stderr.splitlines()
        assert line.startswith("Error: ") and option in line and says in line, (args, line)
        assert line.endswith("--help')"), line
    assert not (tmp_path / "data").exists(), "a refused command touched the data dir"


def test_every_numeric_option_is_bounded():
    """A count, port or interval of 0 or below is refused by the option's type
    (serve --port -1 was a traceback, --workers 0 a late exit 1, rebuild
    --batch-size -5 ran): no numeric option may be a bare int or float."""
    import click

    from kandev_es.cli import main

    def commands(command: click.Command, path: str):
        yield path, command
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from commands(sub, f"{path} {name}")

    numeric = 0
    for path, command in commands(main, "kandev-es"):
        for param in command.params:
            if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
                numeric += 1
                assert isinstance(param.type, click.IntRange | click.FloatRange), (
                    path, param.name,
                )
    assert numeric >= 6
