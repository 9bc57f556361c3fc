"""`kandev-es workspace advance-numbers --by N`: after a restore that lost tasks
created after the backup (their numbers were already shown to callers), each
workspace's numbering moves N past the last number the store issued, so a new
task never takes an identifier a lost one had. Both backends."""

from __future__ import annotations

import json

from tests.integration.helpers import create


def test_after_advancing_by_ten_the_next_task_skips_ten_numbers(
    cli, client, services, workspace, member
):
    _, secret = member
    other = services.workspaces.open("other", "OTH")
    assert create(client, secret, title="a").json["identifier"] == "KAN-1"
    assert create(client, secret, title="b").json["identifier"] == "KAN-2"

    moved = cli("workspace", "advance-numbers", "--by", "10")
    assert moved.exit_code == 0, moved.output
    lines = {row["name"]: row for row in map(json.loads, moved.stdout.splitlines())}
    assert lines[workspace.name]["next_identifier_at_least"] == "KAN-13"
    assert lines["other"]["next_identifier_at_least"] == "OTH-11"  # none issued yet

    assert create(client, secret, title="c").json["identifier"] == "KAN-13"
    only = cli("workspace", "advance-numbers", "--by", "5", "--workspace", "other")
    assert only.exit_code == 0 and json.loads(only.stdout)["id"] == str(other.id)


def test_advancing_by_nothing_is_a_usage_error_that_changes_nothing(cli, workspace):
    refused = cli("workspace", "advance-numbers", "--by", "0")
    assert refused.exit_code == 2
