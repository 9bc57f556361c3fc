"""The HTTP worker's bounds (docs/security.md: Input limits and streams) come from the
environment: finite positive seconds and a positive connection count, else
InvalidSetting (the CLI's one-line exit 2)."""

from __future__ import annotations

import pytest

from kandev_es.config import load_settings
from kandev_es.errors import InvalidSetting


def test_defaults() -> None:
    settings = load_settings({})
    assert (settings.header_timeout, settings.body_timeout, settings.idle_timeout) == (10, 30, 5)
    assert settings.max_connections == 2048
    assert settings.send_timeout == 60


def test_set_values_are_read() -> None:
    settings = load_settings(
        {
            "KANDEV_HEADER_TIMEOUT": "2.5",
            "KANDEV_BODY_TIMEOUT": "3",
            "KANDEV_IDLE_TIMEOUT": "1",
            "KANDEV_MAX_CONNECTIONS": "4096",
            "KANDEV_SEND_TIMEOUT": "7",
        }
    )
    assert (settings.header_timeout, settings.body_timeout, settings.idle_timeout) == (2.5, 3, 1)
    assert settings.max_connections == 4096
    assert settings.send_timeout == 7


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KANDEV_HEADER_TIMEOUT", "nan"),
        ("KANDEV_HEADER_TIMEOUT", "inf"),
        ("KANDEV_BODY_TIMEOUT", "0"),
        ("KANDEV_BODY_TIMEOUT", "-1"),
        ("KANDEV_IDLE_TIMEOUT", "1e300"),
        ("KANDEV_IDLE_TIMEOUT", "soon"),
        ("KANDEV_MAX_CONNECTIONS", "0"),
        ("KANDEV_MAX_CONNECTIONS", "many"),
        ("KANDEV_SEND_TIMEOUT", "0"),
        ("KANDEV_SEND_TIMEOUT", "0.5"),
    ],
)
def test_unusable_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(InvalidSetting) as refused:
        load_settings({name: value})
    assert name in refused.value.message and "\n" not in refused.value.message
