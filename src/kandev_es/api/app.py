"""The app factory: extensions, blueprints and error handlers, each in a small
named function. No application object is built at import time."""

from __future__ import annotations

from flask import Flask, Response, request
from flask_smorest import Api

from kandev_es import __version__, metrics
from kandev_es.api import (
    agentctl,
    api_docs,
    audit_page,
    errors,
    events,
    health,
    identities,
    office,
    parked,
    resources,
    tasks,
    tokens,
    webhooks,
    workspaces,
)
from kandev_es.api.context import EXTENSION_KEY
from kandev_es.background import work
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings, load_settings
from kandev_es.errors import NO_STORE
from kandev_es.limits import check_query_string, parse_cursor
from kandev_es.observability import serving, tracing
from kandev_es.observability.middleware import with_request_ids
from kandev_es.services.stream_slots import StreamSlots


def create_app(
    settings: Settings | None = None,
    services: Services | None = None,
    *,
    run_projections: bool | None = None,
) -> Flask:
    """The app over ``services`` (made from ``settings`` if not given).
    ``run_projections``: whether this process also runs the background work in
    threads (background/work.py); None, as KANDEV_BACKGROUND says: not where a
    background process does it (`serve`, http/gunicorn.conf.py), else yes."""
    settings = settings or (services.settings if services else load_settings())
    # Before the store's pools connect: psycopg's instrumentation traces the
    # connections made after it (observability/tracing.py).
    tracing.configure(settings)
    services = services or bootstrap(settings)
    app = Flask("kandev_es")
    _configure(app, settings)
    app.extensions[EXTENSION_KEY] = services
    app.extensions[events.STREAM_SLOTS_KEY] = StreamSlots(
        settings.max_streams, settings.max_streams_per_token
    )
    api = _register_api(app)
    _register_blueprints(api)
    api_docs.register(app, settings.api_docs)
    # HTML, not part of the REST contract: a plain blueprint, outside the OpenAPI.
    app.register_blueprint(audit_page.blp)
    errors.register(app)
    _follow_requests(app)
    if run_projections is None:
        run_projections = settings.background in ("", "threads")
    if run_projections:
        work.start(services)  # each loop leads by its own lock: one per database works
    return app


def _configure(app: Flask, settings: Settings) -> None:
    app.config.update(
        API_TITLE="kandev-es",
        API_VERSION=__version__,
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/api",
        OPENAPI_JSON_PATH="openapi.json",
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        JSON_SORT_KEYS=False,
        API_SPEC_OPTIONS={
            "components": {
                "securitySchemes": {
                    "bearer": {
                        "type": "http",
                        "scheme": "bearer",
                        "description": (
                            "Authorization: Bearer <token>: a workspace (member or operator) "
                            "or admin token from `kandev-es token create`, or an agent "
                            "run's credential on the run routes"
                        ),
                    }
                }
            },
            "security": [{"bearer": []}],
            "info": {
                "description": (
                    "Idempotent task creation by external ID. A create carrying an "
                    "external_id returns the one task that holds it."
                )
            },
        },
        **api_docs.page_config(settings.api_docs),
    )


class _Api(Api):  # type: ignore[misc]
    # Document the error body errors.py really sends ({error, message, details})
    # as the default and 422 responses, instead of flask-smorest's own shape.
    ERROR_SCHEMA = errors.ApiErrorSchema


def _register_api(app: Flask) -> Api:
    return _Api(app)


def _register_blueprints(api: Api) -> None:
    api.register_blueprint(tasks.blp)
    api.register_blueprint(workspaces.blp)
    api.register_blueprint(tokens.blp)
    api.register_blueprint(health.blp)
    api.register_blueprint(resources.blp)
    api.register_blueprint(events.blp)
    api.register_blueprint(identities.blp)
    api.register_blueprint(office.blp)
    api.register_blueprint(agentctl.blp)
    api.register_blueprint(parked.blp)
    api.register_blueprint(webhooks.blp)


def _follow_requests(app: Flask) -> None:
    """Each request's id, access line and count (observability/middleware.py:
    the one path every answer takes, the HTTP front's refusals too; its count
    and time to its headers by method, URL rule and status, so a stream's body
    is not in its latency), its span when traces are on (a caller's
    traceparent its parent), and what its log lines say of it (the route, the
    workspace in its path). One hook before and one after each request: Flask
    pays a call and a check of each hook on every request."""
    wrapped = with_request_ids(tracing.instrument_wsgi(app.wsgi_app), metrics.record_request)
    app.wsgi_app = wrapped  # type: ignore[assignment,method-assign]
    metrics.instruments()  # made now, in this worker, so a scrape shows them at 0

    @app.before_request
    def _started() -> None:
        rule = request.url_rule.rule if request.url_rule is not None else None
        current = serving.current()
        if current is not None:
            current.route = rule
            serving.note_workspace((request.view_args or {}).get("workspace_id"))
        tracing.name_request(request.method, rule, serving.current_request_id())
        _check_query()

    @app.after_request
    def _answered(response: Response) -> Response:
        return _no_store(response)


def _check_query() -> None:
    """Every route: a query string that is UTF-8, and an ``after`` cursor and
    ``Last-Event-ID`` in 0..2^63-1 (400, before any view or stream starts)."""
    if request.query_string:  # most requests have none: nothing to parse
        check_query_string(request.query_string)
        parse_cursor(request.args.get("after"))
    parse_cursor(request.headers.get("Last-Event-ID"), "Last-Event-ID")


def _no_store(response: Response) -> Response:
    """errors.NO_STORE on every answer but a static asset."""
    if not (request.endpoint or "").endswith("static"):
        response.headers[NO_STORE[0]] = NO_STORE[1]
    return response
