"""`kandev-es task import FILE`: a tracker's export (JSON lines or CSV, `-` for
stdin) created in batches by external ID, with a progress bar, a summary table
by outcome and, with --report, one JSON line per item. Running the same import
again answers every item found.

Without --url it reaches the store directly, as `task create` does (the batch
service, POST /api/v1/tasks/batch's); with --url it sends the batches to a
server with the Python client (`Client.create_many`), the token read from
KANDEV_TOKEN (never a flag: a command line is visible to other users)."""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import click

from kandev_es.cli_usage import open_store, store_options, workspace_id
from kandev_es.config import CLIENT_TOKEN_VARIABLE, client_token
from kandev_es.errors import KandevError

if TYPE_CHECKING:  # the client, rich and the domain load when an import runs, not for --help
    from kandev_es.client import BatchItem

LIST_COLUMNS = ("repositories", "attachments")
BOOLEAN_COLUMNS = ("start_agent",)


@dataclass(frozen=True)
class Line:
    """One item of the file: where it was (1-based line or row) and its body,
    or why it could not be read (then it is not sent)."""

    number: int
    body: dict[str, Any] | None
    problem: str | None = None


def _jsonl_items(stream: IO[str]) -> Iterator[Line]:
    for number, text in enumerate(stream, 1):
        if not text.strip():
            continue
        try:
            body = json.loads(text)
        except ValueError:
            yield Line(number, None, "not JSON")
            continue
        if isinstance(body, dict):
            yield Line(number, body)
        else:
            yield Line(number, None, "not a JSON object")


def _csv_items(stream: IO[str]) -> Iterator[Line]:
    """A header row of create fields; an empty cell leaves its field out;
    repositories and attachments are ';'-separated, start_agent true/false."""
    for number, row in enumerate(csv.DictReader(stream), 2):  # row 1 is the header
        body: dict[str, Any] = {}
        for name, value in row.items():
            if name is None or value is None or value == "":
                continue
            if name in LIST_COLUMNS:
                body[name] = [part.strip() for part in value.split(";") if part.strip()]
            elif name in BOOLEAN_COLUMNS:
                body[name] = value.strip().lower() in ("1", "true", "yes", "y")
            else:
                body[name] = value
        yield Line(number, body)


def _local_batches(
    workspace: str, bodies: list[dict[str, Any]], chunk_size: int, atomic: bool
) -> Iterator[BatchItem]:
    """The batches through the store, as POST /api/v1/tasks/batch runs them."""
    from kandev_es.bulk.results import FAILED
    from kandev_es.client import BatchItem
    from kandev_es.domain.principal import LOCAL_CLI

    services = open_store()
    try:
        ws = workspace_id(services, workspace)
        for start in range(0, len(bodies), chunk_size):
            chunk = bodies[start : start + chunk_size]
            body = {"workspace_id": str(ws), "tasks": chunk, "atomic": atomic}
            try:
                result = services.batch.create_many(LOCAL_CLI, body)
            except KandevError as error:
                for index in range(len(chunk)):
                    yield BatchItem(start + index, FAILED, 0, error=error.to_dict())
                continue
            for item in result.items:
                answer = item.to_response()
                yield BatchItem(
                    start + item.index,
                    item.outcome,
                    item.status,
                    task=answer.get("result"),
                    error=answer.get("error"),
                )
    finally:
        services.close()


def _remote_batches(
    url: str, workspace: str, bodies: list[dict[str, Any]], chunk_size: int, atomic: bool
) -> Iterator[BatchItem]:
    from kandev_es.client import Client, ClientError, DeadlineExceeded

    token = client_token()
    if token is None:
        raise click.UsageError(f"--url needs the token in {CLIENT_TOKEN_VARIABLE}")
    with Client(url, token) as client:
        try:
            yield from client.create_many(workspace, bodies, chunk_size=chunk_size, atomic=atomic)
        except (ClientError, DeadlineExceeded) as error:
            raise click.ClickException(f"the server refused the import: {error}") from None


def _report_line(line: Line, item: BatchItem | None) -> dict[str, Any]:
    from kandev_es.bulk.results import FAILED

    body = line.body or {}
    entry: dict[str, Any] = {"line": line.number, "external_id": body.get("external_id")}
    if item is None:
        entry.update(outcome=FAILED, error={"error": "unreadable_line", "message": line.problem})
        return entry
    entry["index"] = item.index
    entry["outcome"] = item.outcome
    if item.task is not None:
        entry.update(task_id=item.task.get("id"), identifier=item.task.get("identifier"))
    else:
        entry["error"] = item.error
    return entry


def _progress() -> Any:
    """The import's progress bar on stderr, gone when it ends."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("importing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )


def _summary(counts: Counter[str]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from kandev_es.bulk.results import OUTCOMES

    table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False)
    table.add_column("outcome")
    table.add_column("items", justify="right")
    for outcome in OUTCOMES:
        if counts[outcome]:
            table.add_row(outcome, str(counts[outcome]))
    table.add_row("total", str(sum(counts.values())), style="bold")
    Console(highlight=False).print(table)


@click.command("import", short_help="Create tasks from a JSON-lines or CSV file, by external ID.")
@click.argument("source", type=click.File("r", encoding="utf-8"))
@click.option("--workspace", required=True, help="workspace (id or name) the tasks go in")
@click.option(
    "--format",
    "kind",
    type=click.Choice(["jsonl", "csv"]),
    default=None,
    help="the file's format [default: csv for a .csv file, else jsonl]",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="items per batch",
)
@click.option("--atomic", is_flag=True, help="each batch all or nothing")
@click.option(
    "--report",
    type=click.File("w", encoding="utf-8"),
    default=None,
    help="write one JSON line per item: line, index, external ID, outcome, task id or error",
)
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"send the batches to this server (token in {CLIENT_TOKEN_VARIABLE}) instead of "
    "reaching the store directly",
)
@store_options
def task_import(
    source: IO[str],
    workspace: str,
    kind: str | None,
    chunk_size: int,
    atomic: bool,
    report: IO[str] | None,
    url: str | None,
) -> None:
    """Create a task for each item of SOURCE (`-`: stdin): JSON lines, one create
    body a line, or CSV with a header row of create fields. Each item is created
    or found by its external_id, so running the same import again answers every
    item found and makes nothing twice. Exit 1 if any item failed."""
    from kandev_es.bulk.results import FAILED

    if kind is None:
        kind = "csv" if getattr(source, "name", "").endswith(".csv") else "jsonl"
    lines = list(_csv_items(source) if kind == "csv" else _jsonl_items(source))
    readable = [line for line in lines if line.body is not None]
    bodies = [line.body for line in readable if line.body is not None]
    if url is not None:
        items = _remote_batches(url, workspace, bodies, chunk_size, atomic)
    else:
        items = _local_batches(workspace, bodies, chunk_size, atomic)
    answered: dict[int, BatchItem] = {}
    with _progress() as bar:
        progress = bar.add_task("import", total=len(bodies))
        for item in items:
            answered[item.index] = item
            bar.advance(progress)
    at = {id(line): place for place, line in enumerate(readable)}
    counts: Counter[str] = Counter()
    for line in lines:
        entry = _report_line(line, answered.get(at[id(line)]) if line.body is not None else None)
        counts[entry["outcome"]] += 1
        if report is not None:
            report.write(json.dumps(entry) + "\n")
    _summary(counts)
    if counts[FAILED]:
        raise SystemExit(1)


def register(main: click.Group) -> None:
    task = main.commands["task"]
    assert isinstance(task, click.Group)
    task.add_command(task_import)
