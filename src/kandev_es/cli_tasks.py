"""Commands for people at a terminal: `workspace list` and `task create / get /
lookup / list`. Each calls the service the REST route calls (`task create` is the one
create protocol, CreationService.create, as POST /api/v1/tasks) and prints a
table; with --json it prints what that route answers, on one line, for scripts.

The local CLI reaches the store directly with no token (domain/principal.py
LOCAL_CLI): it may act on every workspace, and its creates are recorded as "cli"."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from kandev_es.cli_usage import UUID_ARGUMENT, open_store, store_options, workspace_id
from kandev_es.errors import KandevError
from kandev_es.limits import MAX_CURSOR, MAX_LIST_LIMIT

if TYPE_CHECKING:  # rich, the domain and the views load when a command runs, not for --help
    from rich.table import Table

# What a reader looks for first in a task; the other fields follow in the API's order.
_FIRST = ("outcome", "identifier", "title", "state", "external_id", "id", "workspace_id")

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="print the JSON the REST API answers (one line, for scripts) instead of a table",
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value) or "-"
    if isinstance(value, Mapping):
        return json.dumps(value)
    return str(value)


def _refused(error: KandevError) -> click.ClickException:
    """A refusal as one line: the REST error code, its message, and the fields
    it names (what REST puts in ``details``)."""
    parts = [error.message if error.code == error.message else f"{error.code}: {error.message}"]
    fields = error.details.get("fields")
    if isinstance(fields, Mapping):
        parts += [f"{name}: {_cell(messages)}" for name, messages in fields.items()]
    elif "field" in error.details:
        parts.append(f"field {error.details['field']}")
    return click.ClickException("; ".join(parts))


def _table(**options: Any) -> Table:
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE, pad_edge=False, **options)


def _print(table: Table) -> None:
    from rich.console import Console

    # No highlighting: a table piped to a file or a pager stays plain text.
    Console(highlight=False).print(table)


def _show(data: Mapping[str, Any], as_json: bool) -> None:
    """One object: its JSON on one line, or a two-column table of its fields."""
    if as_json:
        click.echo(json.dumps(data))
        return
    table = _table(show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    keys = [key for key in _FIRST if key in data] + [key for key in data if key not in _FIRST]
    for key in keys:
        table.add_row(key, _cell(data[key]))
    _print(table)


@click.command("list")
@json_option
@store_options
def workspace_list(as_json: bool) -> None:
    """List the live workspaces (deleted ones are left out), oldest first.

    The table shows name, id, task prefix, WIP limit (wip) and registered repositories;
    --json prints a JSON array of workspaces as GET /api/v1/workspaces/{id}
    answers each one."""
    from kandev_es.views import workspace_dto

    services = open_store()
    try:
        listed = [workspace_dto(found) for found in services.workspaces.list_live()]
    finally:
        services.close()
    if as_json:
        click.echo(json.dumps(listed))
        return
    table = _table()
    table.add_column("name", overflow="fold", min_width=8)
    table.add_column("id", no_wrap=True, min_width=36)  # a UUID is copied whole
    for column in ("prefix", "wip", "repositories"):
        table.add_column(column, overflow="fold")
    for found in listed:
        table.add_row(
            found["name"], found["id"], found["task_prefix"],
            _cell(found["wip_limit"]), _cell(sorted(found["repositories"])),
        )
    _print(table)


@click.group()
def task() -> None:
    """Tasks: create one (idempotent by --external-id), read one by id, look one
    up by external ID, list a workspace's."""


@task.command("create", short_help="Create a task; a retry with the same --external-id finds it.")
@click.option("--workspace", required=True, help="workspace (id or name) the task goes in")
@click.option("--title", required=True, help="the task's title (1 to 500 characters)")
@click.option(
    "--external-id",
    default=None,
    help="your system's stable id for this task (e.g. JIRA-1): a create with an id that a "
    "task already holds returns that task instead of making another",
)
@click.option("--description", default=None, help="free text [default: empty]")
@click.option("--workflow", default=None, help="workflow name [default: default]")
@click.option(
    "--workflow-step", default=None, help="step of the workflow [default: its first step]"
)
@click.option("--parent", "parent_id", default=None, help="parent task id: a subtask of it")
@click.option(
    "--repository",
    "repositories",
    multiple=True,
    help="a repository registered in the workspace, by name, to give the task a worktree "
    "of (repeat for several)",
)
@json_option
@store_options
def task_create(
    workspace: str,
    title: str,
    external_id: str | None,
    description: str | None,
    workflow: str | None,
    workflow_step: str | None,
    parent_id: str | None,
    repositories: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create a task through the create protocol, as POST /api/v1/tasks does.

    With --external-id a retry returns the same task (outcome found_settled)
    instead of a second one. Every outcome exits 0; outcome found_unsettled
    means another create holds the identity and has not finished: use that
    task, never release the identity and create again. A refused create is
    one line on stderr and exit 1."""
    from kandev_es.creation.outcomes import CreateTaskResponseSchema
    from kandev_es.domain.principal import LOCAL_CLI

    services = open_store()
    try:
        body: dict[str, Any] = {"workspace_id": str(workspace_id(services, workspace)),
                                "title": title}
        for name, value in (
            ("external_id", external_id), ("description", description), ("workflow", workflow),
            ("workflow_step", workflow_step), ("parent_id", parent_id),
        ):
            if value is not None:
                body[name] = value
        if repositories:
            body["repositories"] = list(repositories)
        result = services.creation.create(LOCAL_CLI, body)
    except KandevError as error:
        raise _refused(error) from None
    finally:
        services.close()
    _show(CreateTaskResponseSchema().dump(result.to_response()), as_json)


@task.command("get")
@click.argument("task_id", type=UUID_ARGUMENT)
@json_option
@store_options
def task_get(task_id: uuid.UUID, as_json: bool) -> None:
    """Show the task TASK_ID (its UUID), as GET /api/v1/tasks/{id} answers it
    (read from the event store: no projection lag)."""
    from kandev_es.domain.principal import LOCAL_CLI
    from kandev_es.views import task_dto

    services = open_store()
    try:
        found = task_dto(services.tasks.get(LOCAL_CLI, task_id))
    except KandevError as error:
        raise _refused(error) from None
    finally:
        services.close()
    _show(found, as_json)


@task.command("forget", short_help="Forget a task's free text (erasure); proofs stay valid.")
@click.argument("task_id", type=UUID_ARGUMENT)
@click.option("--reason", required=True, help="why (recorded; never the erased values)")
@click.option(
    "--operation-id",
    default=None,
    help="a stable id for this erasure (as the Idempotency-Key); default: a new one",
)
@json_option
@store_options
def task_forget(task_id: uuid.UUID, reason: str, operation_id: str | None, as_json: bool) -> None:
    """Forget TASK_ID's title and description, as POST /api/v1/tasks/{id}/forget:
    their data key is deleted, the read models and feeds rewritten, a Forgotten
    event recorded; every event, checkpoint and proof stays byte-identical. Then
    run the store's documented VACUUM (docs/operations.md: Erasure)."""
    from kandev_es.domain.principal import LOCAL_CLI

    services = open_store()
    try:
        result = services.forgetting().forget(
            LOCAL_CLI, task_id, reason, operation_id or f"cli-{uuid.uuid4()}"
        )
    except KandevError as error:
        raise _refused(error) from None
    finally:
        services.close()
    body = {**result.body, "replayed": result.replayed}
    _show(body, as_json)


@task.command("lookup", short_help="Show the task holding an external ID (no side effects).")
@click.option("--workspace", required=True, help="workspace (id or name)")
@click.option("--external-id", required=True, help="the external ID to look up")
@json_option
@store_options
def task_lookup(workspace: str, external_id: str, as_json: bool) -> None:
    """Show the task holding an external ID and whether its creation finished
    (creation_complete), as GET /api/v1/workspaces/{id}/tasks/by-external-id
    answers. Changes nothing. No task holds it: one line on stderr, exit 1."""
    from kandev_es.domain.external_id import require_external_id

    try:
        wanted = require_external_id(external_id)
    except KandevError as error:
        raise click.BadParameter(error.message, param_hint="--external-id") from None
    services = open_store()
    try:
        target = workspace_id(services, workspace)
        found = services.creation.lookup(target, wanted)
    finally:
        services.close()
    if found is None:
        raise click.ClickException(f"no task holds {wanted!r} in workspace {target}")
    _show(found.to_lookup_response(), as_json)


def _list_table(items: list[dict[str, Any]]) -> Table:
    """A row a task, fitting 80 columns: ``task`` is its identifier, the state
    column says ``archived`` for an archived task; the id (copied whole) and the
    identifier never wrap."""
    table = _table()
    table.add_column("task", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("external_id", overflow="fold", min_width=11)
    table.add_column("title", overflow="fold", min_width=5)
    table.add_column("id", no_wrap=True, min_width=36)
    for item in items:
        state = "archived" if item["archived"] else item["state"]
        table.add_row(
            item["identifier"], state, _cell(item.get("external_id")), item["title"], item["id"]
        )
    return table


@task.command("list", short_help="List a workspace's tasks, a page at a time.")
@click.option("--workspace", required=True, help="workspace (id or name)")
@click.option("--external-id", default=None, help="only the task holding this external ID")
@click.option(
    "--after",
    type=click.IntRange(0, MAX_CURSOR),
    default=0,
    show_default=True,
    help="cursor: the tasks after it (the previous page's next_cursor)",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="most tasks on the page",
)
@click.option(
    "--include-archived/--exclude-archived",
    default=True,
    show_default=True,
    help="whether archived tasks are listed",
)
@json_option
@store_options
def task_list(
    workspace: str,
    external_id: str | None,
    after: int,
    limit: int,
    include_archived: bool,
    as_json: bool,
) -> None:
    """List a workspace's tasks in creation order, as GET
    /api/v1/workspaces/{id}/tasks answers (the same filters; --json prints that
    answer: items, next_cursor, has_more). When more follow, the table ends
    with the --after to pass for the next page. Read from the tasks read model."""
    from kandev_es.domain.external_id import normalize_external_id

    try:
        wanted = None if external_id is None else normalize_external_id(external_id)
    except KandevError as error:
        raise click.BadParameter(error.message, param_hint="--external-id") from None
    services = open_store()
    try:
        page = services.tasks.list(
            workspace_id(services, workspace),
            external_id=wanted,
            after=after,
            limit=limit,
            include_archived=include_archived,
        )
    finally:
        services.close()
    if as_json:
        click.echo(json.dumps(page.to_dict()))
        return
    _print(_list_table(page.items))
    if page.has_more:
        click.echo(f"more: --after {page.next_cursor}")


def register(main: click.Group, workspace: click.Group) -> None:
    workspace.add_command(workspace_list)
    main.add_command(task)
