"""What switches logs and traces (docs/observability.md, docs/configuration.md):
KANDEV_LOG_FORMAT is text or json, nothing else; traces are off unless the
standard OTEL_* variables name an exporter or an endpoint; a caller's request id
is kept only when it is short and plain."""

from __future__ import annotations

import pytest

from kandev_es.config import load_settings
from kandev_es.errors import InvalidSetting
from kandev_es.observability.serving import MAX_LENGTH, accepted


def test_the_log_format_is_text_unless_json_is_asked_and_nothing_else_is_accepted():
    assert load_settings({}).log_format == "text"
    assert load_settings({"KANDEV_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(InvalidSetting, match="KANDEV_LOG_FORMAT"):
        load_settings({"KANDEV_LOG_FORMAT": "logfmt"})


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "kandev-es"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_traces_are_off_unless_the_otel_variables_enable_them(environ, on):
    assert load_settings(environ).tracing is on


def test_an_exporter_or_protocol_that_is_not_shipped_is_refused():
    with pytest.raises(InvalidSetting, match="OTEL_TRACES_EXPORTER"):
        load_settings({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(InvalidSetting, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_a_caller_request_id_is_kept_only_when_short_and_plain():
    for kept in ("a", "req_1.2:3-x", "A" * MAX_LENGTH):
        assert accepted(kept) == kept
    for replaced in (None, "", "A" * (MAX_LENGTH + 1), "a b", "a\nb", "é", "x;y", "a=b"):
        fresh = accepted(replaced)
        assert fresh != replaced and len(fresh) == 32 and int(fresh, 16) >= 0
