"""Hostile input against the served OpenAPI: schemathesis generates requests for
every documented operation of a real in-process app, on both backends, with a
valid admin bearer token, and checks that no response is a 5xx and every
response matches its documented schema.

Bounded for CI: a few examples per operation, no deadline. The SSE stream is
left out (it holds the response open up to max_seconds by design)."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from kandev_es.api import create_app
from tests.conftest import bearer

TOKEN_HEADER: dict[str, dict[str, str]] = {}


@pytest.fixture
def api_schema(services: Any, admin: Any) -> Any:
    app = create_app(services=services, run_projections=False)
    TOKEN_HEADER["headers"] = bearer(admin[1])
    return schemathesis.openapi.from_wsgi("/api/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=r"/events/stream$")


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_generated_requests_never_get_a_5xx_or_an_undocumented_response(case: Any) -> None:
    case.call_and_validate(
        headers=TOKEN_HEADER["headers"],
        checks=[not_a_server_error, response_schema_conformance],
    )
