"""The operator CLI: workspaces and tokens print JSON; tokens work once issued."""

from __future__ import annotations

import json
import os
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
    assert cli("db", "init").exit_code == 0
    assert cli("workspace", "create", "dup").exit_code == 0
    again = cli("workspace", "create", "dup")
    assert again.exit_code != 0
    assert "already exists" in again.output


def test_token_create_for_workspace_and_admin(cli, settings):
    assert cli("db", "init").exit_code == 0
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
    assert cli("db", "init").exit_code == 0
    assert cli("token", "create").exit_code != 0
    assert cli("token", "create", "--admin", "--workspace", str(uuid.uuid4())).exit_code != 0
    unknown = cli("token", "create", "--workspace", str(uuid.uuid4()))
    assert unknown.exit_code != 0 and "no workspace" in unknown.output
    by_name = cli("token", "create", "--workspace", "nope")
    assert by_name.exit_code != 0 and "no workspace 'nope'" in by_name.output


def test_invalid_workspace_name_is_refused(cli):
    assert cli("db", "init").exit_code == 0
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


def _in_process(settings, *args: str, **extra: str):
    """`kandev-es` run in this process (click's runner) with the environment
    ``_run`` gives its subprocess, the root logger as it was after: for the
    many usage errors and help pages of one test, where each process's start
    (about 1 s of imports) proves nothing one subprocess case does not."""
    import logging
    import subprocess

    from click.testing import CliRunner

    from kandev_es.cli import main
    from tests.support.served import environment

    env: dict[str, str | None] = dict(environment(settings, COLUMNS="80", **extra))
    env.update({k: None for k in os.environ if k.startswith("KANDEV_") and k not in env})
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        result = CliRunner().invoke(main, list(args), env=env, prog_name="kandev-es")
    finally:
        root.handlers[:], root.level = handlers, level
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def _first_in_a_process():
    """A runner whose first call is a real `kandev-es` process (``_run``: what
    reaches its stderr, its exit code) and every later one ``_in_process``."""
    runners = iter([_run])

    def run(settings, *args: str, **extra: str):
        return next(runners, _in_process)(settings, *args, **extra)

    return run


def test_help_shows_whole_summaries(tmp_path):
    from kandev_es.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    groups = [(), ("db",), ("projections",), ("identity",), ("audit",), ("agentctl",),
              ("agentctl", "task"), ("token",), ("workspace",), ("task",)]
    for group in groups:  # the first in a real process, the rest in this one
        run = _in_process if group else _run
        result = run(settings, *group, "--help")
        assert result.returncode == 0, result.stderr
        assert "Commands:" in result.stdout
        assert "..." not in result.stdout.split("Commands:", 1)[1], (group, result.stdout)


def test_db_init_prints_backend_and_location_without_secrets(settings):
    result = _run(settings, "db", "init")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    line = lines[0]
    if settings.database_url:
        from urllib.parse import urlsplit

        # The suite's single server has no standby: the second line says so.
        assert len(lines) == 3 and lines[1].startswith("NOT durable (")

        password = urlsplit(settings.database_url).password
        assert line.startswith("initialised postgres: postgresql://")
        assert password is None or password not in result.stdout + result.stderr
        assert urlsplit(settings.database_url).hostname in line
    else:
        assert lines[:-1] == [f"initialised sqlite: {settings.sqlite_path.resolve()}"]
    # Every event already stored is logged and a checkpoint signed (docs/auditing.md).
    assert lines[-1] == "ledger: 0 events in the log, checkpoint signed"


def test_commands_are_quiet_unless_asked(settings):
    assert _run(settings, "db", "init").returncode == 0
    quiet = _run(settings, "workspace", "create", "hush")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == [store_line(settings)]  # and no log line
    loud = _run(settings, "--log-level", "info", "workspace", "create", "loud")
    assert loud.returncode == 0 and "INFO kandev_es schema attested" in loud.stderr


def test_once_commands_print_a_one_line_summary(settings):
    assert _run(settings, "db", "init").returncode == 0
    assert _in_process(settings, "workspace", "create", "summary").returncode == 0
    projected = _run(settings, "projections", "run", "--once")
    assert projected.returncode == 0, projected.stderr
    [line] = projected.stdout.splitlines()
    assert line.startswith("projections caught up: ") and "events processed" in line
    recovered = _in_process(settings, "runtime", "--once")
    assert recovered.returncode == 0, recovered.stderr
    assert recovered.stdout.splitlines() == ["runtime: 0 creations settled"]


def test_bad_numeric_setting_is_a_one_line_usage_error(settings):
    run = _first_in_a_process()
    for name in ("KANDEV_POOL_SIZE", "KANDEV_LEASE_SECONDS"):
        result = run(settings, "db", "init", **{name: "abc"})
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"Error: {name} must be {'an integer' if 'POOL' in name else 'a number'}, got 'abc'"
        ]
        assert result.stdout == ""
    # nothing was created: the failure came before any storage was touched
    assert not settings.sqlite_path.exists() or settings.database_url


def test_unusable_audit_link_seconds_are_a_one_line_usage_error(settings):
    """nan, infinities, 1e300 and negatives are refused before the command runs
    (they used to reach timedelta() and print a traceback)."""
    run = _first_in_a_process()
    for value in ("nan", "inf", "1e300", "-1"):
        result = run(
            settings, "identity", "history", "--workspace", "w", "--external-id", "e",
            KANDEV_AUDIT_LINK_SECONDS=value,
        )
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert line == (
            f"Error: KANDEV_AUDIT_LINK_SECONDS must be seconds in [0, 31622400], got '{value}'"
        )
        assert "Traceback" not in result.stderr and result.stdout == ""


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
    (("creations", "retry", "--workspace", "W", "--operation-id", "o", "x"), "IDENTITY_ID",
     "not a UUID"),
    (("creations", "abort", "--workspace", "W", "--operation-id", "o", "x"), "IDENTITY_ID",
     "not a UUID"),
    (("release", "--workspace", "W"), "--external-id", "Missing option"),
    (("serve", "--bogus"), "--bogus", "No such option"),
    (("nope",), "nope", "No such command"),
]


def test_every_bad_option_value_is_a_one_line_usage_error_that_starts_nothing(tmp_path):
    """Exit 2, one line on stderr naming the option and the
    command's --help, nothing on stdout, no traceback, nothing initialised."""
    from kandev_es.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    for index, (args, option, says) in enumerate(BAD_VALUES):
        # The first in a real process (what reaches its stderr), the rest in this one.
        result = (_in_process if index else _run)(settings, *args)
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


def store_line(settings) -> str:
    """What every command that opens the store prints first on stderr."""
    return f"kandev-es: {settings.backend} store {settings.location}"


def _schema_exists(settings) -> bool:
    import psycopg

    target = settings.postgres
    with psycopg.connect(target.conninfo) as connection:
        rows = connection.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (target.schema,)
        ).fetchall()
    return bool(rows)


ONE_SHOT = [
    ("workspace", "create", "w"),
    ("token", "create", "--admin"),
    ("token", "list"),
    ("token", "revoke", str(uuid.UUID(int=1))),
    ("identity", "history", "--workspace", "default", "--external-id", "JIRA-1"),
    ("release", "--workspace", "default", "--external-id", "JIRA-1", "--operation-id", "op-1"),
    ("audit", "verify"),
    ("runtime", "--once"),
    ("projections", "run", "--once"),
    ("projections", "rebuild"),
]


def test_a_command_where_there_is_no_store_says_so_in_one_line_and_creates_nothing(settings):
    """Before, these created ./.kandev-es and reported "schema attestation FAILED
    ... no such table", which reads like corruption; on PostgreSQL they created the
    URL's schema."""
    run = _first_in_a_process()
    for args in ONE_SHOT:
        result = run(settings, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stdout == "", args
        [line] = result.stderr.splitlines()
        assert line.startswith(f"Error: no kandev-es store at {settings.location}: "), line
        assert "kandev-es db init" in line
    assert not settings.data_dir.exists()
    if settings.database_url:
        assert not _schema_exists(settings)


def test_with_no_setting_a_command_looks_in_the_working_directory_and_creates_nothing(tmp_path):
    import subprocess

    from tests.support.served import kandev_command

    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KANDEV_")}
    result = subprocess.run(
        [*kandev_command(), "identity", "history", "--workspace", "default",
         "--external-id", "JIRA-1"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    where = tmp_path.resolve() / ".kandev-es" / "kandev.sqlite3"
    assert line.startswith(f"Error: no kandev-es store at {where}: "), line
    assert list(tmp_path.iterdir()) == []


def test_every_store_command_names_its_store_with_the_password_masked(settings):
    from urllib.parse import urlsplit

    password = urlsplit(settings.database_url).password if settings.database_url else None
    assert _run(settings, "db", "init").returncode == 0
    run = _first_in_a_process()
    for args in [
        ("workspace", "create", "named"),
        ("token", "create", "--admin"),
        ("token", "list"),
        ("identity", "history", "--workspace", "named", "--external-id", "NOBODY"),
        ("audit", "verify"),
        ("runtime", "--once"),
        ("projections", "run", "--once"),
    ]:
        result = run(settings, *args)
        assert result.stderr.splitlines()[0] == store_line(settings), (args, result.stderr)
        assert password is None or password not in result.stdout + result.stderr
        if args[0] != "identity":
            assert result.returncode == 0, (args, result.stderr)
    assert "***" in store_line(settings) or password is None


def test_data_dir_and_database_url_options_take_the_place_of_the_environment(settings, tmp_path):
    from kandev_es.config import Settings

    assert _in_process(settings, "db", "init").returncode == 0
    assert _in_process(settings, "workspace", "create", "here").returncode == 0
    elsewhere = Settings(data_dir=tmp_path / "elsewhere")  # no store there
    options = ["--data-dir", str(settings.data_dir)]
    if settings.database_url:
        options += ["--database-url", settings.database_url]
    issued = _run(elsewhere, "token", "create", "--workspace", "here", *options)
    assert issued.returncode == 0, issued.stderr
    assert issued.stderr.splitlines() == [store_line(settings)]
    assert json.loads(issued.stdout)["token"].startswith("kes_")
    assert not (tmp_path / "elsewhere").exists()
    wrong = _in_process(elsewhere, "token", "list", "--database-url", "mysql://x")
    assert wrong.returncode == 2 and "not a postgresql:// URL" in wrong.stderr


def test_workspace_takes_a_name_or_an_id_everywhere(settings):
    """Before, identity history took a name but token create and release only a UUID;
    release printed its 404 as JSON on stdout where every other error is one line.
    The first release runs in a real process (what reaches its stderr), every
    other command in this one."""
    assert _in_process(settings, "db", "init").returncode == 0
    made = json.loads(_in_process(settings, "workspace", "create", "ops").stdout)
    for value in ("ops", made["id"]):
        issued = _in_process(
            settings, "token", "create", "--workspace", value, "--role", "operator")
        assert issued.returncode == 0, issued.stderr
        released = (_run if value == "ops" else _in_process)(
            settings, "release", "--workspace", value, "--external-id", "NOBODY",
            "--operation-id", f"op-{value}",
        )
        assert released.returncode == 1 and released.stdout == ""
        assert released.stderr.splitlines() == [
            store_line(settings),
            f"Error: task not found: no task holds 'NOBODY' in workspace {made['id']}",
        ]
        history = _in_process(
            settings, "identity", "history", "--workspace", value, "--external-id", "NOBODY"
        )
        assert history.returncode == 1
        assert history.stderr.splitlines()[1:] == ["Error: identity not found"]
    listed = [json.loads(line)
              for line in _in_process(settings, "token", "list").stdout.splitlines()]
    assert [t["workspace_id"] for t in listed] == [made["id"], made["id"]]
    unknown = _in_process(settings, "release", "--workspace", "nope", "--external-id", "X",
                          "--operation-id", "op")
    assert unknown.returncode == 2
    assert "no workspace 'nope'" in unknown.stderr.splitlines()[-1]


def test_version_is_one_number_for_the_cli_the_package_and_the_server(tmp_path, services):
    from importlib.metadata import version

    from kandev_es import __version__
    from kandev_es.api import create_app
    from kandev_es.config import Settings

    shown = _run(Settings(data_dir=tmp_path / "data"), "--version")
    assert shown.returncode == 0 and shown.stdout == f"kandev-es {__version__}\n"
    assert version("kandev-es") == __version__
    served = create_app(services=services, run_projections=False).test_client().get("/healthz")
    assert served.json == {"status": "ok", "version": __version__}


def test_db_init_on_an_unreachable_database_is_one_line_without_its_password(tmp_path):
    """Before: a 45-line traceback."""
    import pytest

    pytest.importorskip("psycopg")
    from kandev_es.config import Settings

    url = "postgresql://kandev:s3cret@127.0.0.1:1/kandev"
    for args in (("db", "init"), ("token", "list")):
        result = _run(Settings(data_dir=tmp_path / "data", database_url=url), *args)
        assert result.returncode == 1 and result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith(
            "Error: database unavailable at postgresql://kandev:***@127.0.0.1:1/kandev: "
        ), line
        assert "s3cret" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_serve_points_log_level_to_the_global_option_and_shows_its_worker_default(tmp_path):
    from kandev_es.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    misplaced = _run(settings, "serve", "--log-level", "debug")
    assert misplaced.returncode == 2 and misplaced.stdout == ""
    assert misplaced.stderr.splitlines() == [
        "Error: --log-level is a global option: kandev-es --log-level debug serve"
        " (see 'kandev-es serve --help')"
    ]
    shown = " ".join(_run(settings, "serve", "--help").stdout.split())
    assert "[default: (1 on SQLite, 2 on PostgreSQL); x>=1]" in shown
    assert "kandev-es --log-level debug serve" in shown
    assert not (tmp_path / "data").exists()


def test_an_argument_that_is_not_utf8_is_a_one_line_usage_error_that_stores_nothing(settings):
    """A non-UTF-8 byte in argv reaches Python as a lone surrogate
    (surrogateescape); it is refused before any command runs, instead of a
    traceback where it was first encoded (a workspace name, a token label)."""
    assert _run(settings, "db", "init").returncode == 0
    store = bootstrap(settings.with_overrides(create_tables=False))
    try:
        before = store.app.max_notification_id()
        for args in (("workspace", "create", "w" + os.fsdecode(b"\xff")),
                     ("token", "create", "--admin", "--label", os.fsdecode(b"\xed\xa0\x80"))):
            result = _run(settings, *args)
            assert result.returncode == 2, result.stderr
            assert result.stderr.strip().splitlines() == [
                f"Error: argument {len(args)} is not valid UTF-8 text (see 'kandev-es --help')"
            ]
            assert result.stdout == ""
        assert store.app.max_notification_id() == before
        made = _run(settings, "token", "create", "--admin", "--label", "caf\u00e9")  # UTF-8 is fine
        assert made.returncode == 0, made.stderr
    finally:
        store.close()
