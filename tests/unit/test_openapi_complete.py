"""Every operation of the published OpenAPI document (http/openapi.json, generated
from the views' docstrings and decorators by scripts/export-openapi) tells a
reader what it does and what it takes and answers: a summary, a description, its
request body's schema, what each of its query and header parameters means, its
success answer's schema and its errors. The API
reference page and /api/docs render exactly this document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("get", "post", "put", "patch", "delete")
# Writes that take no body at all: the path says everything.
BODYLESS = {
    ("post", "/api/v1/tasks/{task_id}/archive"),
    ("post", "/api/v1/workspaces/{workspace_id}/creations/{identity_id}/retry"),
    ("post", "/api/v1/workspaces/{workspace_id}/creations/{identity_id}/abort"),
    ("post", "/api/v1/workspaces/{workspace_id}/webhooks/{webhook_id}/pause"),
    ("post", "/api/v1/workspaces/{workspace_id}/webhooks/{webhook_id}/resume"),
}


def has_schema(answer: dict[str, Any]) -> bool:
    return any("schema" in media for media in answer.get("content", {}).values())


def gaps(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    found = []
    for part in ("summary", "description"):
        if not (operation.get(part) or "").strip():
            found.append(f"no {part}")
    takes_body = method in ("post", "put", "patch") and (method, path) not in BODYLESS
    if takes_body and not has_schema(operation.get("requestBody", {})):
        found.append("no request body schema")
    for parameter in operation.get("parameters", []):
        # A path parameter is named by the path itself; a query or header one is not.
        if parameter.get("in") != "path" and not (parameter.get("description") or "").strip():
            found.append(f"no description of {parameter['in']} parameter {parameter['name']}")
    responses = operation.get("responses", {})
    successes = {code: answer for code, answer in responses.items() if code.startswith("2")}
    if not any(code == "204" or has_schema(answer) for code, answer in successes.items()):
        found.append("no success response with a schema")
    errors = [answer for code, answer in responses.items() if code[0] in "45"]
    if not any(has_schema(answer) for answer in errors):
        found.append("no documented error")
    return found


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, item[method])
        for path, item in spec["paths"].items()
        for method in METHODS
        if method in item
    ]


def test_every_operation_has_summary_description_schemas_and_errors():
    spec = json.loads((ROOT / "http" / "openapi.json").read_text(encoding="utf-8"))
    found = operations(spec)
    assert len(found) > 20
    incomplete = {
        f"{method.upper()} {path}": problems
        for method, path, operation in found
        if (problems := gaps(method, path, operation))
    }
    assert incomplete == {}


def test_an_operation_without_a_description_or_errors_is_reported():
    operation = {
        "summary": "Get a task",
        "responses": {"200": {"content": {"application/json": {"schema": {}}}}},
    }
    assert gaps("get", "/api/v1/tasks/{task_id}", operation) == [
        "no description", "no documented error"]
    assert gaps("put", "/x", {**operation, "description": "d"}) == [
        "no request body schema", "no documented error"]
    after = {"name": "after", "in": "query", "schema": {"type": "integer"}}
    where = {"name": "workspace_id", "in": "path", "required": True}
    listed = {**operation, "description": "d", "parameters": [where, after]}
    assert gaps("get", "/w/{workspace_id}/tasks", listed) == [
        "no description of query parameter after", "no documented error"]
