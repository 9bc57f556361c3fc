"""The one parser of ``Authorization`` (REST, Office and MCP over HTTP)."""

from __future__ import annotations

import pytest

from kandev_es.services.auth import bearer_of


@pytest.mark.parametrize(
    "header, secret",
    [
        ("Bearer kes_abc", "kes_abc"),
        ("bearer  kes_abc ", "kes_abc"),
        ("BEARER kes_abc", "kes_abc"),
        ("Bearer ", None),
        ("Bearer", None),
        ("Basic kes_abc", None),
        ("kes_abc", None),
        ("", None),
    ],
)
def test_only_a_bearer_scheme_with_a_secret_yields_one(header, secret):
    assert bearer_of(header) == secret
