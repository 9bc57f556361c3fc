"""The MCP server on the official SDK's low-level ``Server``: tool definitions
are published as written in ``mcp.tools`` and arguments reach the services raw
(the high-level server would validate them first, turning a Found into an error).

Authentication: every call acts with a bearer token, authenticated per call so
a revoked token stops working at once. Over stdio it is the one token the
process was started with (``KANDEV_TOKEN``); over streamable HTTP it is the
request's ``Authorization: Bearer`` header, and nothing else.

Over HTTP the server keeps no sessions (the SDK's stateless mode: each POST
gets a transport that ends with it), and ``TokenGate`` refuses a request whose
token does not authenticate with 401 ``unauthenticated`` before the SDK sees
it: nobody without a token can make the server hold anything. A token holder
gets only POST (one answer each): a GET would be a stream the stateless server
never writes to but holds until the client leaves, so it is 405."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
)
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kandev_es import __version__
from kandev_es.bootstrap import Services
from kandev_es.domain.principal import Principal
from kandev_es.errors import (
    NO_STORE,
    KandevError,
    MethodNotAllowed,
    Unauthenticated,
    http_status,
)
from kandev_es.limits import check_json_text
from kandev_es.mcp import errors, tools
from kandev_es.mcp.handlers import HANDLERS
from kandev_es.observability import serving, tracing
from kandev_es.services.auth import bearer_of

log = logging.getLogger("kandev_es.mcp")

SecretSource = Callable[[ServerRequestContext[Any, Any]], str | None]

INSTRUCTIONS = (
    "Kandev tasks. create_task_kandev is create-if-absent by external_id: safe to repeat, "
    "but it creates a task when none holds the identity, so it is not a probe. "
    + tools.SAFETY_STATEMENT
)


def build_server(services: Services, secret_for: SecretSource) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=list(tools.TOOLS))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        handler = HANDLERS.get(params.name)
        if handler is None:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        arguments = dict(params.arguments or {})
        secret = secret_for(ctx)

        def work() -> dict[str, Any]:
            with tracing.span(f"mcp {params.name}", **{"kandev.request_id": request_id}):
                check_json_text(arguments)  # what api/context.json_object checks
                principal = services.tokens.authenticate(secret)
                return handler(services, principal, arguments)

        # Over HTTP the id TokenGate answered with; over stdio one per call.
        request_id = serving.accepted(request_header(ctx, serving.HEADER))
        with serving.acting_for(request_id):  # the worker thread runs in a copy of it
            return await _answer(params.name, work)

    return Server(
        "kandev-es",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _answer(name: str, work: Callable[[], dict[str, Any]]) -> CallToolResult:
    """The tool's result: its body, or its error mapped once (mcp/errors.py)."""
    try:
        body = await anyio.to_thread.run_sync(work)
    except KandevError as error:
        status = http_status(error)
        log.info("mcp tool=%s error=%s status=%s", name, error.code, status)
        return errors.failure(error)
    except Exception as error:
        return errors.unexpected(error)
    log.info(
        "mcp tool=%s workspace=%s task=%s outcome=%s",
        name, body.get("workspace_id"), body.get("id"), body.get("outcome"),
    )
    return errors.success(body)


def request_header(ctx: ServerRequestContext[Any, Any], name: str) -> str | None:
    """A header of this HTTP request; None on a transport without headers."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return None
    value = headers.get(name.lower())
    return None if value is None else str(value)


def bearer_header(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The token of this HTTP request; None on a transport without headers."""
    return bearer_of(request_header(ctx, "authorization") or "")


def serve_stdio(services: Services, token: str | None) -> None:
    from mcp.server.stdio import stdio_server

    if not token:
        log.warning("KANDEV_TOKEN is not set: every tool call will be refused")
    server = build_server(services, lambda ctx: token)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    services.projections.start_thread(services.settings.projection_poll_seconds)
    anyio.run(run)


def _answer_headers(send: Send, request_id: str) -> Send:
    """``send`` adding the REST API's Cache-Control (errors.NO_STORE: a create
    tool's result carries its creation_handle) and the request's X-Request-Id
    to every answer."""
    added = {
        NO_STORE[0].lower().encode(): NO_STORE[1].encode(),
        serving.HEADER.lower().encode(): request_id.encode(),
    }

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [h for h in message.get("headers", []) if h[0].lower() not in added]
            message = {**message, "headers": [*headers, *added.items()]}
        await send(message)

    return sending


def _with_request_id(scope: Scope, request_id: str) -> Scope:
    """The request as the SDK (and so each tool call) sees it: its
    X-Request-Id header is the id this answer carries."""
    name = serving.HEADER.lower().encode()
    headers = [h for h in scope.get("headers", []) if h[0].lower() != name]
    return {**scope, "headers": [*headers, (name, request_id.encode())]}


class TokenGate:
    """ASGI in front of the MCP app: an HTTP request goes on only if its bearer
    token authenticates (read afresh, as every REST request does); otherwise it
    is answered 401 ``unauthenticated`` here, before the SDK parses it or builds
    anything for it. Then only POST goes on (405 ``method_not_allowed``, Allow:
    POST). Tool calls still authorize per call (``build_server``)."""

    def __init__(self, app: ASGIApp, authenticate: Callable[[str], Principal | None]) -> None:
        self._app = app
        self._authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the app's own startup and shutdown
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = serving.accepted(headers.get(serving.HEADER))
        scope, send = _with_request_id(scope, request_id), _answer_headers(send, request_id)
        secret = bearer_of(headers.get("authorization", ""))
        try:
            if secret is None or await anyio.to_thread.run_sync(self._authenticate, secret) is None:
                raise Unauthenticated("MCP over HTTP needs Authorization: Bearer <a valid token>")
            if scope["method"] != "POST":
                raise MethodNotAllowed("this MCP server keeps no sessions: POST each message")
        except KandevError as error:
            with serving.acting_for(request_id):
                await _refuse(error, scope, receive, send)
            return
        await self._app(scope, receive, send)


async def _refuse(error: KandevError, scope: Scope, receive: Receive, send: Send) -> None:
    headers: dict[str, str] = {}
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(error, MethodNotAllowed):
        headers["Allow"] = "POST"
    if http_status(error) == 503:
        headers["Retry-After"] = "1"
    body = serving.with_request_id(error.to_dict())
    response = JSONResponse(body, http_status(error), headers=headers)
    await response(scope, receive, send)


def http_app(services: Services, host: str, path: str = "/mcp") -> ASGIApp:
    """The streamable-HTTP app, stateless, behind the token gate."""
    server = build_server(services, bearer_header)
    app = server.streamable_http_app(streamable_http_path=path, host=host, stateless_http=True)
    return TokenGate(app, services.tokens.authenticate)
