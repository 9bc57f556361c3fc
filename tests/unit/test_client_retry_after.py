"""The client reads Retry-After in both of its HTTP forms (delta-seconds and
an HTTP date); anything else falls back to the client's own backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
from kandev_es_client import _retry_after


def _answer(value: str | None) -> httpx.Response:
    headers = {} if value is None else {"Retry-After": value}
    return httpx.Response(503, headers=headers)


def test_delta_seconds_and_http_dates_are_honoured_garbage_falls_back():
    assert _retry_after(_answer("3"), 0.1) == 3.0
    assert _retry_after(_answer(" 2.5 "), 0.1) == 2.5
    assert _retry_after(_answer("-4"), 0.1) == 0.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 60 < _retry_after(_answer(later), 0.1) <= 120
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=120), usegmt=True)
    assert _retry_after(_answer(past), 0.1) == 0.0
    for garbage in (None, "", "soon", "Mon, 99 Foo 2026"):
        assert _retry_after(_answer(garbage), 0.1) == 0.1
    assert _retry_after(None, 0.7) == 0.7
