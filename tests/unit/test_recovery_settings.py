"""The bounded-recovery settings: defaults 3 step attempts, 5 takeovers, 5 s
backoff base; a value that would unbound recovery is a setting error."""

from __future__ import annotations

import pytest

from kandev_es.config import load_settings
from kandev_es.errors import InvalidSetting


def test_defaults_bound_recovery():
    settings = load_settings({})
    assert (settings.step_attempts, settings.recovery_attempts) == (3, 5)
    assert settings.recovery_backoff_seconds == 5.0


def test_values_are_read_from_the_environment():
    settings = load_settings(
        {
            "KANDEV_STEP_ATTEMPTS": "2",
            "KANDEV_RECOVERY_ATTEMPTS": "7",
            "KANDEV_RECOVERY_BACKOFF_SECONDS": "0.5",
        }
    )
    assert (settings.step_attempts, settings.recovery_attempts) == (2, 7)
    assert settings.recovery_backoff_seconds == 0.5


@pytest.mark.parametrize(
    "name, value",
    [
        ("KANDEV_STEP_ATTEMPTS", "0"),
        ("KANDEV_STEP_ATTEMPTS", "x"),
        ("KANDEV_RECOVERY_ATTEMPTS", "-1"),
        ("KANDEV_RECOVERY_BACKOFF_SECONDS", "-1"),
        ("KANDEV_RECOVERY_BACKOFF_SECONDS", "nan"),
        ("KANDEV_RECOVERY_BACKOFF_SECONDS", "inf"),
    ],
)
def test_a_value_that_would_unbound_recovery_is_refused(name, value):
    with pytest.raises(InvalidSetting):
        load_settings({name: value})
