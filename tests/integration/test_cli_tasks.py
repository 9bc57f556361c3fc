"""Commands for people (issue 35 point 7, issue 46 point 5): `workspace list`,
`task create`, `task get`, `task lookup` and `task list` go through the services
REST uses, print a table by default, and with --json print exactly what the REST
route answers."""

from __future__ import annotations

import json
import urllib.parse
import uuid

from tests.conftest import bearer


def rest(client, method: str, path: str, token: str, body: dict | None = None) -> dict:
    reply = client.open(path, method=method, headers=bearer(token), json=body)
    assert reply.status_code == 200, reply.get_json()
    return reply.get_json()


def answer(result) -> dict:
    """The one JSON line a --json command printed (stderr names the store)."""
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    return json.loads(line)


def lookup_path(workspace_id: object, external_id: str) -> str:
    query = urllib.parse.urlencode({"external_id": external_id})
    return f"/api/v1/workspaces/{workspace_id}/tasks/by-external-id?{query}"


def test_task_create_is_the_create_protocol_and_answers_as_rest_does(
    cli, client, workspace, member
):
    _, token = member
    first = answer(cli("task", "create", "--workspace", "acme", "--title", "Fix the invoice",
                       "--external-id", "JIRA-1", "--description", "from the CLI", "--json"))
    assert first["outcome"] == "created" and first["identifier"] == "KAN-1"
    assert first["workspace_id"] == str(workspace.id) and "creation_handle" in first

    # REST retrying the CLI's identity finds the CLI's task, and the CLI
    # retrying it answers the very same JSON
    over_rest = rest(client, "POST", "/api/v1/tasks", token, {
        "workspace_id": str(workspace.id), "external_id": "JIRA-1", "title": "Fix the invoice",
    })
    again = answer(cli("task", "create", "--workspace", str(workspace.id),
                       "--title", "Fix the invoice", "--external-id", "JIRA-1", "--json"))
    assert again == over_rest
    assert again["outcome"] == "found_settled" and again["id"] == first["id"]

    looked_up = answer(cli("task", "lookup", "--workspace", "acme", "--external-id", "JIRA-1",
                           "--json"))
    assert looked_up == rest(client, "GET", lookup_path(workspace.id, "JIRA-1"), token)
    assert looked_up["creation_complete"] is True
    got = answer(cli("task", "get", first["id"], "--json"))
    assert got == rest(client, "GET", f"/api/v1/tasks/{first['id']}", token)
    assert got["description"] == "from the CLI"

    # without --json: a table of the same fields, for a person
    table = cli("task", "create", "--workspace", "acme", "--title", "Fix the invoice",
                "--external-id", "JIRA-1")
    assert table.exit_code == 0, table.output
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines() if line.strip()}
    assert rows["outcome"] == ["found_settled"] and rows["identifier"] == ["KAN-1"]
    assert rows["title"] == ["Fix", "the", "invoice"] and rows["id"] == [first["id"]]
    assert "{" not in table.stdout


def test_workspace_list_shows_live_workspaces_as_rest_shows_each(cli, client, services):
    made = [services.workspaces.open(name, prefix) for name, prefix in
            (("payments", "PAY"), ("gone", "GON"), ("ops", "OPS"))]
    services.workspace_deletion.delete(made[1].id, actor="test")
    admin, _ = services.tokens.issue(workspace_id=None, admin=True)

    listed = answer(cli("workspace", "list", "--json"))
    assert listed == [rest(client, "GET", f"/api/v1/workspaces/{w.id}", admin)
                      for w in (made[0], made[2])]

    table = cli("workspace", "list")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert [line.split()[:3] for line in lines if "PAY" in line or "OPS" in line] == [
        ["payments", str(made[0].id), "PAY"], ["ops", str(made[2].id), "OPS"],
    ]
    assert "gone" not in table.stdout


def test_task_commands_refuse_in_one_line_and_create_nothing(cli, client, workspace, member):
    _, token = member
    refusals = {
        ("task", "create", "--workspace", "acme", "--title", " "):
            (1, "Error: validation_failed: invalid create request; title: title must not be blank"),
        ("task", "create", "--workspace", "acme", "--title", "T", "--workflow-step", "nope"):
            (1, "Error: unknown_reference: workflow 'default' has no step 'nope';"
                " field workflow_step"),
        ("task", "lookup", "--workspace", "acme", "--external-id", "NOBODY"):
            (1, f"Error: no task holds 'NOBODY' in workspace {workspace.id}"),
        ("task", "get", str(uuid.uuid4())): (1, "Error: task not found"),
    }
    for args, (code, message) in refusals.items():
        result = cli(*args)
        assert result.exit_code == code, (args, result.output)
        assert result.stdout == "" and result.stderr.splitlines()[-1] == message, args
    usage = {
        ("task", "get", "KAN-1"): "Invalid value for TASK_ID: not a UUID",
        ("task", "create", "--workspace", "nope", "--title", "T"): "no workspace 'nope'",
        ("task", "lookup", "--workspace", "acme", "--external-id", ""): "--external-id",
        ("task", "create", "--workspace", "acme"): "Missing option '--title'",
    }
    for args, fragment in usage.items():
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        [line] = result.stderr.splitlines()[-1:]
        assert line.startswith("Error: ") and fragment in line, (args, line)
    listed = rest(client, "GET", f"/api/v1/workspaces/{workspace.id}/tasks", token)
    assert listed["items"] == []


def test_a_task_the_cli_creates_is_recorded_as_created_by_the_cli(cli, services, workspace):
    created = answer(cli("task", "create", "--workspace", "acme", "--title", "T",
                         "--external-id", "CLI-1", "--json"))
    shown = cli("identity", "history", "--workspace", "acme", "--external-id", "CLI-1", "--json")
    assert shown.exit_code == 0, shown.output
    [claimed] = [e for e in json.loads(shown.stdout)["events"] if e["event"] == "Claimed"]
    assert claimed["actor"] == "cli" and claimed["task_id"] == created["id"]


def test_task_list_takes_the_rest_lists_filters_and_answers_as_it_does(
    cli, client, workspace, member
):
    _, token = member
    made = [
        answer(cli("task", "create", "--workspace", "acme", "--title", f"Task {n}",
                   "--external-id", f"L-{n}", "--json"))
        for n in range(5)
    ]
    archived = client.post(f"/api/v1/tasks/{made[1]['id']}/archive", headers=bearer(token))
    assert archived.status_code == 200, archived.get_json()
    base = f"/api/v1/workspaces/{workspace.id}/tasks"
    first = rest(client, "GET", f"{base}?limit=2", token)
    assert first["has_more"] is True and len(first["items"]) == 2
    queries = {
        ("--limit", "2"): "limit=2",
        ("--limit", "2", "--after", str(first["next_cursor"])):
            f"limit=2&after={first['next_cursor']}",
        ("--exclude-archived",): "include_archived=false",
        ("--external-id", " L-3 "): "external_id=%20L-3%20",
        ("--external-id", "NOBODY"): "external_id=NOBODY",
        (): "",
    }
    for args, query in queries.items():
        listed = answer(cli("task", "list", "--workspace", "acme", *args, "--json"))
        assert listed == rest(client, "GET", f"{base}?{query}", token), args
    every = answer(cli("task", "list", "--workspace", str(workspace.id), "--json"))
    assert [task["id"] for task in every["items"]] == [task["id"] for task in made]
    assert every["has_more"] is False and every["next_cursor"] is None
    kept = answer(cli("task", "list", "--workspace", "acme", "--exclude-archived", "--json"))
    assert made[1]["id"] not in [task["id"] for task in kept["items"]]

    # the table: one row a task, and the --after of the next page when there is one
    table = cli("task", "list", "--workspace", "acme", "--limit", "2")
    assert table.exit_code == 0, table.output
    lines = [line.split() for line in table.stdout.splitlines() if line.strip(" ─")]
    assert lines[0] == ["task", "state", "external_id", "title", "id"]
    assert lines[1] == ["KAN-1", "active", "L-0", "Task", "0", made[0]["id"]]
    assert lines[2] == ["KAN-2", "archived", "L-1", "Task", "1", made[1]["id"]]
    assert lines[-1] == ["more:", "--after", str(first["next_cursor"])]
    last = cli("task", "list", "--workspace", "acme", "--after", str(first["next_cursor"]))
    assert "more:" not in last.stdout and "KAN-5" in last.stdout


def test_task_list_refuses_bad_input_in_one_usage_line(cli, workspace):
    for args, fragment in {
        ("--limit", "0"): "--limit",
        ("--limit", "501"): "--limit",
        ("--after", "-1"): "--after",
        ("--after", "x"): "--after",
        ("--external-id", "A\x01"): "--external-id",
    }.items():
        result = cli("task", "list", "--workspace", "acme", *args)
        assert result.exit_code == 2, (args, result.output)
        [line] = result.stderr.splitlines()[-1:]
        assert line.startswith("Error: ") and fragment in line, (args, line)
    unknown = cli("task", "list", "--workspace", "nope")
    assert unknown.exit_code == 2 and "no workspace 'nope'" in unknown.stderr
