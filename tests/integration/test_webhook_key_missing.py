"""A second API node on the same database whose data dir never ran ``db init``
has no webhook key: its workers still start and serve, it delivers nothing
(another node with the deployment's key does), and the public-key route says
why with a typed 503 instead of a 500."""

from __future__ import annotations

import logging

import pytest

from kandev_es.api import create_app
from kandev_es.background.work import _start_webhooks
from kandev_es.bootstrap import bootstrap
from tests.conftest import bearer


@pytest.fixture
def keyless(settings, tmp_path):
    key = tmp_path / "node-b" / "webhook.key"
    services = bootstrap(settings.with_overrides(webhook_key_file=key))
    key.unlink(missing_ok=True)  # what `db init` made there: node B never ran it
    yield services
    services.close()


def test_a_node_without_the_webhook_key_starts_and_delivers_nothing(keyless, caplog):
    with caplog.at_level(logging.ERROR, logger="kandev_es.background"):
        assert _start_webhooks(keyless) is None  # no thread
    assert "delivers no webhooks" in caplog.text
    assert "KANDEV_WEBHOOK_KEY_FILE" in caplog.text
    assert keyless.webhooks._deliverer is None  # never built, so never leads


def test_the_public_key_route_answers_a_typed_503_without_the_key(keyless):
    client = create_app(services=keyless, run_projections=False).test_client()
    secret, _ = keyless.tokens.issue(workspace_id=None, admin=True)
    answer = client.get("/api/v1/webhooks/public-key", headers=bearer(secret))
    assert answer.status_code == 503, answer.json
    assert answer.json["error"] == "webhook_key_missing"
