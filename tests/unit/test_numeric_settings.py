"""Every numeric setting (config.INT_SETTINGS, config.SECONDS_SETTINGS: the one
table load_settings reads them through) accepts its bounds and refuses nan,
infinities, huge, negative and non-numbers with InvalidSetting: one line
naming the setting, which the CLI prints as a usage error (exit 2)."""

from __future__ import annotations

import pytest

from kandev_es.config import INT_SETTINGS, SECONDS_SETTINGS, load_settings
from kandev_es.errors import InvalidSetting

BAD_SECONDS = ["nan", "NaN", "inf", "-inf", "infinity", "1e300", "-1", "soon", "1,5"]
BAD_INTS = ["nan", "inf", "1e3", "2.5", "9" * 40, "9" * 5000, "-1", "many"]


def _refused(name: str, value: str) -> str:
    with pytest.raises(InvalidSetting) as refused:
        load_settings({name: value})
    message = refused.value.message
    assert name in message and "\n" not in message and len(message) < 200
    return message


@pytest.mark.parametrize("name", sorted(SECONDS_SETTINGS))
@pytest.mark.parametrize("value", BAD_SECONDS)
def test_bad_seconds_are_refused(name: str, value: str) -> None:
    _refused(name, value)


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
@pytest.mark.parametrize("value", BAD_INTS, ids=lambda v: v if len(v) < 12 else f"{len(v)}-digits")
def test_bad_integers_are_refused(name: str, value: str) -> None:
    _refused(name, value)


@pytest.mark.parametrize("name", sorted(SECONDS_SETTINGS))
def test_seconds_bounds(name: str) -> None:
    low, high, low_excluded = SECONDS_SETTINGS[name]
    assert getattr(load_settings({name: str(high)}), _field(name)) == high
    if low_excluded:
        _refused(name, str(low))
        assert getattr(load_settings({name: "0.001"}), _field(name)) == 0.001
    else:
        assert getattr(load_settings({name: str(low)}), _field(name)) == low
    _refused(name, str(high * 2))


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
def test_integer_bounds(name: str) -> None:
    low, high = INT_SETTINGS[name]
    assert getattr(load_settings({name: str(low)}), _field(name)) == low
    assert getattr(load_settings({name: str(high)}), _field(name)) == high
    _refused(name, str(low - 1))
    _refused(name, str(high + 1))


def test_the_defaults_are_inside_the_bounds() -> None:
    load_settings({})  # every numeric setting is read through the tables


def _field(name: str) -> str:
    """The Settings field a setting fills (KANDEV_AUDIT_LINK_SECONDS ->
    audit_link_seconds), found by the value it reads."""
    fields = {
        "KANDEV_PG_CONNECT_TIMEOUT": "pg_connect_timeout",
        "KANDEV_RUN_TOKEN_TTL": "run_token_ttl",
    }
    return fields.get(name, name.removeprefix("KANDEV_").lower())


def test_witness_urls_are_http_urls_and_at_most_fifteen() -> None:
    urls = load_settings({"KANDEV_LEDGER_WITNESS_URLS": " https://w1.example/ ,http://w2:7380"})
    assert urls.ledger_witness_urls == ("https://w1.example", "http://w2:7380")
    assert load_settings({}).ledger_witness_urls == ()
    with pytest.raises(InvalidSetting, match="is not an http"):
        load_settings({"KANDEV_LEDGER_WITNESS_URLS": "w1.example"})
    with pytest.raises(InvalidSetting, match="at most 15"):
        load_settings({"KANDEV_LEDGER_WITNESS_URLS": ",".join(["http://w"] * 16)})
