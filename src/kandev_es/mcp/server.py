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
            check_json_text(arguments)  # what api/context.json_object checks
            principal = services.tokens.authenticate(secret)
            return handler(services, principal, arguments)

        try:
            body = await anyio.to_thread.run_sync(work)
        except KandevError as error:
            status = http_status(error)
            log.info("mcp tool=%s error=%s status=%s", params.name, error.code, status)
            return errors.failure(error)
        except Exception as error:
            return errors.unexpected(error)
        log.info(
            "mcp tool=%s workspace=%s task=%s outcome=%s",
            params.name, body.get("workspace_id"), body.get("id"), body.get("outcome"),
        )
        return errors.success(body)

    return Server(
        "kandev-es",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def bearer_header(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The token of this HTTP request; None on a transport without headers."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    return bearer_of(str(headers.get("authorization", "")))


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


def _no_store(send: Send) -> Send:
    """``send`` adding the REST API's Cache-Control (errors.NO_STORE) to
    every answer: a create tool's result carries its creation_handle."""
    name, value = (part.encode() for part in NO_STORE)

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [h for h in message.get("headers", []) if h[0].lower() != name.lower()]
            message = {**message, "headers": [*headers, (name.lower(), value)]}
        await send(message)

    return sending


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
        send = _no_store(send)
        secret = bearer_of(Headers(scope=scope).get("authorization", ""))
        try:
            if secret is None or await anyio.to_thread.run_sync(self._authenticate, secret) is None:
                raise Unauthenticated("MCP over HTTP needs Authorization: Bearer <a valid token>")
            if scope["method"] != "POST":
                raise MethodNotAllowed("this MCP server keeps no sessions: POST each message")
        except KandevError as error:
            headers: dict[str, str] = {}
            if isinstance(error, Unauthenticated):
                headers["WWW-Authenticate"] = "Bearer"
            if isinstance(error, MethodNotAllowed):
                headers["Allow"] = "POST"
            if http_status(error) == 503:
                headers["Retry-After"] = "1"
            response = JSONResponse(error.to_dict(), http_status(error), headers=headers)
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)


def http_app(services: Services, host: str, path: str = "/mcp") -> ASGIApp:
    """The streamable-HTTP app, stateless, behind the token gate."""
    server = build_server(services, bearer_header)
    app = server.streamable_http_app(streamable_http_path=path, host=host, stateless_http=True)
    return TokenGate(app, services.tokens.authenticate)


def serve_http(services: Services, host: str, port: int, path: str = "/mcp") -> None:
    import uvicorn

    app = http_app(services, host, path)
    services.projections.start_thread(services.settings.projection_poll_seconds)
    log.info("mcp streamable HTTP on http://%s:%s%s", host, port, path)
    uvicorn.run(app, host=host, port=port, log_level="warning")
