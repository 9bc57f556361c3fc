"""Every JSON route in http/openapi.json (an operation whose requestBody takes
application/json), against a real `kandev-es serve` on both backends, with the
admin token and real ids in the path — and every MCP tool, against a real
`kandev-es mcp --http`, with a workspace token and a real task id. Bodies
shaped like a valid one with one field made hostile — lone surrogates, NUL,
huge and non-finite numbers (2**70, 1e400, -0, NaN), number-like strings, deep
nesting, wrong types — and bodies of arbitrary hostile JSON. Every answer is a
4xx (or a 2xx where the input happens to be valid), never a 5xx and never a
hang (each request has a 20 s timeout), and the server logs no unhandled error.

Bounded: a fixed number of examples per backend, derandomized so a failure
reproduces; the shrunk failing request is printed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from kandev_es.mcp.tools import TOOLS
from tests.support.mcp_client import raw_tool_call, server_env
from tests.support.served import ServedMcp, ServedProcess, http

SPEC = Path(__file__).resolve().parents[2] / "http" / "openapi.json"
EXAMPLES = 600
MCP_EXAMPLES = 150
UNKNOWN_FIELD = "__not_a_field__"
JSON = {"Content-Type": "application/json"}


def json_operations() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path template, body schema) of every JSON-bodied operation."""
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    found = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if not isinstance(operation, dict):
                continue
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            schema = content["application/json"]["schema"]
            if "$ref" in schema:
                schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            found.append((method.upper(), path, schema))
    return found


OPERATIONS = json_operations()


class Raw(str):
    """A number written into the body as-is: JSON text json.dumps cannot
    produce (1e400 overflows, -0 is an int, a 400-digit mantissa)."""


def dumps(body: Any) -> bytes:
    """JSON text of ``body`` with each Raw in place as a bare literal. Lone
    surrogates go out as \\uD800 escapes (ensure_ascii), as a client sends them;
    NaN and Infinity as the bare words Python's json writes."""
    raws: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            key = f"__raw_{len(raws)}_{uuid.uuid4().hex}__"
            raws[key] = str(value)
            return key
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(body))
    for key, literal in raws.items():
        text = text.replace(f'"{key}"', literal)
    return text.encode()


UNSTORABLE = ["\ud800", "a\udfff", "\x00", "x\x00y", "\ud83d", "\udc00\x00"]
characters = st.characters(codec=None) | st.sampled_from(["\x00", "\ud800", "\udfff"])
hostile_text = st.sampled_from(UNSTORABLE) | st.text(characters, max_size=12) | st.just(
    "x" * 100_001
)
huge_numbers = st.sampled_from(
    [2**70, -(2**70), 2**63, -(2**63) - 1, 10**30, 1e308, -1e308, -0.0, 5e-324,
     float("nan"), float("inf"), float("-inf")]
)
raw_numbers = st.sampled_from(["1e400", "-1e400", "-0", "-0.0", "1" + "0" * 400 + ".5",
                               "1" + "0" * 5000]).map(Raw)
number_like = st.sampled_from(["NaN", "-0", "1e400", "Infinity", "-Infinity", "9" * 30,
                               "0x10", "1_000", "+1", " 1 ", "true", "null"])
deep = st.integers(min_value=2, max_value=80).flatmap(
    lambda depth: st.sampled_from(["[", "{"]).map(lambda bracket: nest(depth, bracket))
)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | hostile_text
wrong_typed = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=6,
)
hostile_value = st.one_of(hostile_text, huge_numbers, raw_numbers, number_like, deep,
                          wrong_typed)


def nest(depth: int, bracket: str) -> Any:
    value: Any = "\ud800"
    for _ in range(depth):
        value = [value] if bracket == "[" else {"k": value}
    return value


def valid_value(name: str, spec: dict[str, Any], ids: dict[str, str]) -> Any:
    """A value the field accepts (or None to leave it out)."""
    kind = spec.get("type")
    nullable = bool(spec.get("nullable"))
    if isinstance(kind, list):  # JSON Schema's ["string", "null"] (the MCP tools)
        nullable = "null" in kind
        kind = next((k for k in kind if k != "null"), None)
    if name in ("workspace_id", "task_id"):
        return ids[name]
    if name == "url":
        return ids["url"]  # a webhook's: loopback, allowed for this server only
    if name == "event_types":
        return ["task.created"]
    if name == "start_agent":
        return False  # MCP's default is true: no agent unless a hostile value says so
    if spec.get("format") == "uuid" or name == "external_id":
        return None  # no parent, no identity (a Found would skip validation)
    if "enum" in spec:
        return spec["enum"][0]
    if kind == "boolean":
        return False
    if kind == "integer":
        return None if nullable else spec.get("minimum", 1)
    if kind == "array":
        return []
    if name == "path":
        return ids["path"]  # under the repository roots, not a repository: a deep 422
    if spec.get("default") is not None:
        return spec["default"]
    if nullable or name not in ("title", "description", "name", "label", "reason"):
        return None  # e.g. workflow_step: no step every workflow has
    return f"ok-{uuid.uuid4().hex[:8]}"


def valid_body(schema: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    body = {}
    for name, spec in schema.get("properties", {}).items():
        value = valid_value(name, spec, ids)
        if value is not None or name in schema.get("required", []):
            body[name] = value
    return body


@st.composite
def requests(draw: st.DrawFn, ids: dict[str, str]) -> tuple[str, str, bytes]:
    method, template, schema = draw(st.sampled_from(OPERATIONS))
    return method, filled(template, ids), dumps(draw(hostile_body(schema, ids)))


def filled(template: str, ids: dict[str, str]) -> str:
    for name in ("workspace_id", "task_id", "webhook_id"):
        template = template.replace("{" + name + "}", ids[name])
    return template


@st.composite
def hostile_body(draw: st.DrawFn, schema: dict[str, Any], ids: dict[str, str]) -> Any:
    """A valid-shaped body with one field (or one array item, or an unknown
    key) made hostile, or arbitrary hostile JSON."""
    mode = draw(st.sampled_from(["one_bad_field", "one_bad_item", "arbitrary"]))
    body: Any
    if mode == "arbitrary":
        body = draw(st.dictionaries(hostile_text, hostile_value, max_size=4) | hostile_value)
    else:
        body = valid_body(schema, ids)
        properties = schema.get("properties", {})
        field = draw(st.sampled_from([*sorted(properties), UNKNOWN_FIELD]))
        bad = draw(hostile_value)
        if mode == "one_bad_item" and properties.get(field, {}).get("type") == "array":
            body[field] = ["ok", bad]
        else:
            body[field] = bad
    return body


@pytest.fixture
def server(settings: Any, tmp_path: Path) -> Iterator[ServedProcess]:
    # webhooks to the discard port on loopback only: refused connections, no traffic out
    served = ServedProcess(settings, tmp_path, KANDEV_DEMO_AGENT_SECONDS="1",
                           KANDEV_WEBHOOK_ALLOW_HTTP="true",
                           KANDEV_WEBHOOK_ALLOW_NETWORKS="127.0.0.0/8")
    yield served
    served.stop()


def test_the_routes_under_test_are_every_json_route_of_the_contract():
    assert {(method, path) for method, path, _ in OPERATIONS} >= {
        ("POST", "/api/v1/tasks"),
        ("PATCH", "/api/v1/tasks/{task_id}"),
        ("POST", "/api/v1/tokens"),
        ("POST", "/api/v1/workspaces"),
        ("PUT", "/api/v1/workspaces/{workspace_id}/policy"),
        ("POST", "/api/v1/workspaces/{workspace_id}/repositories"),
        ("POST", "/api/v1/office/runtime/tasks"),
        ("POST", "/api/v1/agentctl/tasks"),
    }


@pytest.mark.timeout(600)
def test_hostile_bodies_on_every_json_route_get_a_4xx_never_a_5xx(
    server: ServedProcess, settings: Any
):
    made = http("POST", server.base + "/api/v1/tasks", server.token,
                {"workspace_id": server.workspace_id, "title": "target"})
    assert made.status == 200, made.body
    ids = {"workspace_id": server.workspace_id, "task_id": made.body["id"],
           "path": str(settings.repository_roots[0] / "not-a-repository"),
           "url": "http://127.0.0.1:9/hook"}
    hook = http("POST", f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks",
                server.token, {"url": ids["url"], "event_types": ["task.created"]})
    assert hook.status == 201, hook.body
    ids["webhook_id"] = hook.body["id"]
    # The valid-shaped bodies themselves are valid: a hostile field is what the
    # answers below are about, not a base body refused before validation.
    # Forgetting the task goes last (its free text is not written again after it).
    for method, template, schema in sorted(OPERATIONS, key=lambda o: o[1].endswith("/forget")):
        path = filled(template, ids)
        forget = {"Idempotency-Key": "hostile-1"} if path.endswith("/forget") else {}
        reply = http(method, server.base + path, server.token,
                     raw=dumps(valid_body(schema, ids)), headers={**JSON, **forget})
        expected = 404 if "/office/" in path or "/agentctl/" in path else 200  # no run token
        if path.endswith("/repositories"):
            expected = 422  # not a git repository: refused only after every other check
        assert reply.status // 100 == expected // 100, (method, path, reply.body)
    answered: dict[int, int] = {}

    @settings_(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests(ids))
    def answers_below_500(request: tuple[str, str, bytes]) -> None:
        method, path, raw = request
        reply = http(method, server.base + path, server.token, raw=raw, headers=JSON,
                     timeout=20)
        answered[reply.status] = answered.get(reply.status, 0) + 1
        assert reply.status < 500, (method, path, raw[:300], reply.status, reply.body)
        assert 200 <= reply.status < 300 or isinstance(reply.body, dict), reply.body

    answers_below_500()
    print("statuses:", dict(sorted(answered.items())))
    assert "unhandled error" not in server.output(), server.log()
    assert any(400 <= status < 500 for status in answered), answered


@pytest.mark.timeout(600)
def test_hostile_arguments_to_every_mcp_tool_get_a_4xx_never_a_5xx(
    settings: Any, services: Any, workspace: Any, member: Any, tmp_path: Path
):
    """Each answer is an HTTP 4xx (the SDK refused the JSON-RPC request), or a
    tool result whose status is below 500 — never an HTTP 5xx, never a tool
    error with status 500 (internal_error)."""
    _, secret = member
    ids = {"workspace_id": str(workspace.id), "path": str(tmp_path / "not-a-repository")}
    answered: dict[str, int] = {}
    with ServedMcp(settings, tmp_path, **server_env(settings)) as served:
        made = raw_tool_call(served.url, secret, "create_task_kandev",
                             '{"title": "target", "start_agent": false}')
        ids["task_id"] = made[1]["result"]["structuredContent"]["id"]

        @settings_(max_examples=MCP_EXAMPLES, deadline=None, derandomize=True, database=None,
                   suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(TOOLS).flatmap(
            lambda tool: st.tuples(st.just(tool.name), hostile_body(tool.input_schema, ids))))
        def answers_below_500(call: tuple[str, Any]) -> None:
            tool, arguments = call
            status, reply = raw_tool_call(served.url, secret, tool, dumps(arguments).decode())
            where = (tool, dumps(arguments)[:300], status, reply)
            assert status < 500, where
            result = (reply or {}).get("result")
            if result is None:
                assert 400 <= status < 500 or "error" in (reply or {}), where
                answered["refused by the SDK"] = answered.get("refused by the SDK", 0) + 1
                return
            content = result.get("structuredContent") or {}
            if result.get("isError"):
                assert content.get("status", 500) < 500, where
                key = str(content.get("status"))
            else:
                key = "ok"
            answered[key] = answered.get(key, 0) + 1

        answers_below_500()
        output = served.output()
    print("answers:", answered)
    assert "unhandled error" not in output, output[-4000:]
