"""Following one request (docs/observability.md): its id, the log lines written
while serving it, and its trace.

- ``requests``: the request id (the caller's ``X-Request-Id`` when well formed,
  else a new one) and what else the log lines of a request share, in a
  context variable that a logging filter copies onto every record;
- ``logs``: the text or JSON (``KANDEV_LOG_FORMAT``) log lines, redacted;
- ``tracing``: OpenTelemetry spans, when the ``otel`` extra is installed and
  the standard ``OTEL_*`` variables enable it; a no-op otherwise;
- ``middleware``: the WSGI layer that gives each request its id and writes
  its access line, whatever server runs the app.
"""
