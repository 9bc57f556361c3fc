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
    assert "Traceback" not in result.stderr and "LOUD" in result.stderr
