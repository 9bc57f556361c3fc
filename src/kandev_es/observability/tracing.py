"""OpenTelemetry traces, off unless the standard ``OTEL_*`` variables enable
them (config.py: ``Settings.tracing``) and the ``otel`` extra is installed.

Off, every helper here is a constant no-op (one global read): the create path
pays nothing for spans nobody exports. On, ``configure`` installs the SDK's
tracer provider with the OTLP/HTTP exporter (which reads its own
``OTEL_EXPORTER_OTLP_*`` variables), instruments psycopg, and the app factory
wraps the WSGI app (``instrument_wsgi``) so a caller's ``traceparent`` is the
parent of the request's span."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from kandev_es.config import Settings

log = logging.getLogger("kandev_es.tracing")

_NOOP: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
_tracer: Any = None  # the SDK's tracer once configured; None: tracing is off
_configured = False


def enabled() -> bool:
    return _tracer is not None


def configure(settings: Settings) -> bool:
    """Tracing on for this process if the settings ask for it (once); False
    when it stays off (not asked, or the extra is missing: said once, at WARNING)."""
    global _tracer, _configured
    if _configured or not settings.tracing:
        return enabled()
    _configured = True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* asks for traces but the otel extra is not installed"
            " (pip install 'kandev-es[otel]'): tracing stays off"
        )
        return False
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES override the default name.
    resource = Resource.create({"service.name": "kandev-es"})
    provider = TracerProvider(resource=resource)
    # Before any tracer is made (each keeps the provider's sampler).
    provider.sampler = _no_lone_client_spans(provider.sampler)
    provider.add_span_processor(BatchSpanProcessor(_exporter(settings.trace_exporter)))
    trace.set_tracer_provider(provider)
    _instrument_psycopg()
    _tracer = trace.get_tracer("kandev_es")
    return True


def _no_lone_client_spans(delegate: Any) -> Any:
    """``delegate`` (the sampler OTEL_TRACES_SAMPLER chose), except that a
    client span with no parent -- a statement a background loop runs while
    it looks for work, outside any traced job -- is not recorded: polls make
    no root spans (about 170 of 179 spans in 25 s were those). Work that is
    traced (a request, a background ``Job`` that found something) is the
    parent of its statements, which are kept."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class NoLoneClientSpans(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> Any:
            if kind is trace.SpanKind.CLIENT and not (
                trace.get_current_span(parent_context).get_span_context().is_valid
            ):
                return SamplingResult(Decision.DROP)
            return delegate.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"NoLoneClientSpans{{{delegate.get_description()}}}"

    return NoLoneClientSpans()


def _exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _instrument_psycopg() -> None:
    try:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    except ImportError:  # SQLite only: no psycopg to instrument
        return
    instrumentor = PsycopgInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(skip_dep_check=True)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def instrument_wsgi(app: WSGIApp) -> WSGIApp:
    """``app`` with a server span per request, child of the caller's
    ``traceparent`` when it sends one; ``app`` itself when tracing is off."""
    if _tracer is None:
        return app
    from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

    wrapped: WSGIApp = OpenTelemetryMiddleware(app)
    return wrapped


F = TypeVar("F", bound=Callable[..., Any])


def traced(name: str) -> Callable[[F], F]:
    """A method run inside a span named ``name`` (when tracing is on)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None:
                return function(*args, **kwargs)
            with _tracer.start_as_current_span(name):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def name_request(method: str, route: str | None, request_id: str | None) -> None:
    """The request's span named by its route (``POST /api/v1/tasks``), with
    its request id: a trace is found from the id an operator was handed."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if route is not None:
        current.update_name(f"{method} {route}")
        current.set_attribute("http.route", route)
    if request_id is not None:
        current.set_attribute("kandev.request_id", request_id)


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span named ``name`` under the current one, current within the block."""
    tracer = _tracer
    if tracer is None:
        return _NOOP
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        name, attributes={k: _attribute(v) for k, v in attributes.items() if v is not None}
    )


def note(**attributes: Any) -> None:
    """Attributes of the current span (a step's outcome, an answer's status)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(key, _attribute(value))


def _attribute(value: Any) -> Any:
    return value if isinstance(value, str | bool | int | float) else str(value)


def current_trace_id() -> str | None:
    """The current trace's id (32 hex digits), None outside any trace."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def traceparent() -> str | None:
    """The current span as a W3C ``traceparent`` value (for an agent's
    environment, or a creation's record), None outside any trace."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


class Job:
    """A background job's span (a projection pass, ...): opened only once
    the job finds something to do (``working``; a root in a background
    thread), closed when the job's block ends. A pass that only looked makes no span at all, and its
    statements none either (``_no_lone_client_spans``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._open: contextlib.ExitStack | None = None

    def working(self, **attributes: Any) -> None:
        """The job does something: its span from now on (once), current in this thread."""
        tracer = _tracer
        if tracer is None or self._open is not None:
            return
        opened = contextlib.ExitStack()
        clean = {k: _attribute(v) for k, v in attributes.items() if v is not None}
        opened.enter_context(tracer.start_as_current_span(self.name, attributes=clean))
        self._open = opened

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: Any) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            opened.__exit__(*exc)


@contextlib.contextmanager
def linked(name: str, origin: str | None, **attributes: Any) -> Iterator[None]:
    """A new trace for work done later on behalf of ``origin`` (the
    ``traceparent`` recorded by the request that started it), linked to it:
    the Runtime's recovery of a creation points at the create's trace."""
    tracer = _tracer
    if tracer is None:
        yield
        return
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    links = []
    if origin:
        found = TraceContextTextMapPropagator().extract({"traceparent": origin})
        span_context = trace.get_current_span(found).get_span_context()
        if span_context.is_valid:
            links.append(trace.Link(span_context))
    clean = {k: _attribute(v) for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(
        name, context=context.Context(), links=links, attributes=clean
    ):
        yield
