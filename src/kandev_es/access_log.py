"""gunicorn's access log without secrets. An audit link carries its secret in
the query string (``?audit_link=kal_…``), which the default access line
(request line, referer) would write out; this logger blanks it, and any bearer
secret that might end up in a logged atom. Used by ``kandev-es serve`` and
``http/gunicorn.conf.py`` (``logger_class``)."""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

from kandev_es.redaction import redact

__all__ = ["RedactingLogger", "redact"]


class RedactingLogger(Logger):  # type: ignore[misc]
    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return {k: redact(v) if isinstance(v, str) else v for k, v in atoms.items()}
