"""Secrets blanked out of every log line (the access line, the application's
text and JSON lines) and of what a webhook receiver answered (the delivery
log's snippet): an audit link's secret however its parameter is spelt,
bearer, run and webhook secrets by their prefix (``kes_``, ``kal_``,
``whsec_``, ``whsk_``), the password of a database URL (in its authority or
a ``password=`` parameter), any other bearer credential, and the value of a
``token``/``secret``/``password``/``api_key``/``authorization``/``signature``
field (``name=value``, ``name: value``, ``"name": "value"``)."""

from __future__ import annotations

import re

_PREFIXED = r"(?:kal|kes|whsec|whsk)_"
_SECRETS = re.compile(
    r"(?i)(audit(?:_|%5f)link=)[^&\s\"]*"
    rf"|\b({_PREFIXED})[A-Za-z0-9_\-+/=]+"
    r"|(://[^:/@\s\"]*:)[^@\s\"]*(@)"
    r"|\b(password=)[^&\s\"]*"
    rf"|\b(bearer\s+)(?!{_PREFIXED})[^\s\"',;]+"
    r"|((?:token|secret|password|passwd|api[_-]?key|authorization|signature)"
    r"[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?)[^\s\"',;&}]+"
)


def _blank(match: re.Match[str]) -> str:
    if match.group(1):
        return f"{match.group(1)}[redacted]"
    if match.group(2):
        return f"{match.group(2)}[redacted]"
    if match.group(3):
        return f"{match.group(3)}***{match.group(4)}"
    if match.group(5):
        return f"{match.group(5)}***"
    return f"{match.group(6) or match.group(7)}[redacted]"


# Each alternative above needs one of these in the text (lower-cased: the
# pattern ignores case). Most lines hold none, and testing them is about ten
# times cheaper than the regular expression's scan: the access line of every
# request is redacted.
_MARKERS = (
    "link=", "kal_", "kes_", "whsec_", "whsk_", "://", "password", "bearer", "token",
    "secret", "passwd", "api_key", "api-key", "apikey", "authorization", "signature",
)  # fmt: skip


def may_hold_secret(text: str) -> bool:
    """False when ``redact`` would surely leave ``text`` as it is."""
    lowered = text.lower()
    return any(marker in lowered for marker in _MARKERS)


def redact(text: str) -> str:
    if not may_hold_secret(text):
        return text
    return _SECRETS.sub(_blank, text)


# An absolute path of two or more parts, kept to its last part: the data
# directory's layout is none of an anonymous caller's business.
_PATHS = re.compile(r"(?<![\w.:/])/(?:[^\s/\"'`]+/)+(?=[^\s/\"'`])")


def public_text(text: str) -> str:
    """``text`` fit for an answer anyone may read (/readyz needs no token):
    secrets redacted and each absolute path reduced to its file's name."""
    return _PATHS.sub("", redact(text))
