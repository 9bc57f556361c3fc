"""A receiver's Retry-After (webhooks/transport.py): delta-seconds, an HTTP
date, or nothing the deliverer can use; never an exception. A 'Retry-After: ²'
(a digit to str.isdigit, not to float) raised ValueError out of the attempt:
the subscription's thread logged it and sent the same event again a second
later, for ever, with no attempt recorded, no backoff and no disabling."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from kandev_es.webhooks.transport import retry_after


@pytest.mark.parametrize("value", ["²", "١٢", " ³ ", "2.5", "soon", "-1", ""])
def test_a_retry_after_that_is_no_number_of_seconds_nor_a_date_is_none(value):
    assert retry_after(value, 1_700_000_000.0) is None


def test_seconds_and_dates_are_read():
    assert retry_after(" 120 ", 0.0) == 120.0
    now = 1_700_000_000.0
    assert retry_after(formatdate(now + 30, usegmt=True), now) == pytest.approx(30.0)
    assert retry_after(formatdate(now - 30, usegmt=True), now) == 0.0
