"""gunicorn's access log without secrets. An audit link carries its secret in
the query string (``?audit_link=kal_…``), which the default access line
(request line, referer) would write out; this logger blanks it, and any bearer
secret that might end up in a logged atom. Used by ``kandev-es serve`` and
``http/gunicorn.conf.py`` (``logger_class``)."""

from __future__ import annotations

import re
from typing import Any

from gunicorn.glogging import Logger

# The link parameter's value however it is spelt, and the secrets by prefix.
_SECRETS = re.compile(r"(?i)(audit(?:_|%5f)link=)[^&\s\"]*|\b(kal|kes)_[A-Za-z0-9_\-]+")


def redact(text: str) -> str:
    return _SECRETS.sub(
        lambda m: f"{m.group(1)}[redacted]" if m.group(1) else f"{m.group(2)}_[redacted]", text
    )


class RedactingLogger(Logger):  # type: ignore[misc]
    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return {k: redact(v) if isinstance(v, str) else v for k, v in atoms.items()}
