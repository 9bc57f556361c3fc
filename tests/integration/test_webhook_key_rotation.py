"""The v1a key's rotation (``kandev-es webhook rotate-key``), on both
backends with a real receiver on loopback: the running deliverer signs with
the new key within a second, the old key signs beside it (a second ``v1a``
entry) until its overlap ends, and the published keyring names exactly the
keys that sign, so a receiver verifies with the keyring alone throughout;
the ``v1`` entries still verify with the reference library."""

from __future__ import annotations

import base64
import json
import stat
import time

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from tests.conftest import bearer
from tests.integration.helpers import create
from tests.support.receiver import Receiver


@pytest.fixture
def settings(settings):
    return settings.with_overrides(
        webhook_allow_http=True, webhook_allow_networks=("127.0.0.0/8",), webhook_timeout=2.0
    )


@pytest.fixture
def deliverer(services):
    found = services.webhooks.deliverer()
    thread = found.start_thread()
    yield found
    found.stop()
    thread.join(10)


def keyring(client, secret):
    answer = client.get("/api/v1/webhooks/public-key", headers=bearer(secret))
    assert answer.status_code == 200, answer.json
    return answer.json


def signers(keys, received):
    """The keyring's keys that made the request's v1a entries (each entry
    must verify with one of them)."""
    content = (
        f"{received.headers['webhook-id']}.{received.headers['webhook-timestamp']}.".encode()
        + received.body
    )
    found = []
    for entry in received.headers["webhook-signature"].split():
        if not entry.startswith("v1a,"):
            continue
        signature = base64.b64decode(entry.removeprefix("v1a,"))
        for key in keys:
            public = Ed25519PublicKey.from_public_bytes(
                base64.b64decode(key["public_key"].removeprefix("whpk_"))
            )
            try:
                public.verify(signature, content)
            except InvalidSignature:
                continue
            found.append(key["public_key"])
            break
        else:
            raise AssertionError(f"a v1a entry no key of the keyring verifies: {entry[:20]}")
    return found


def test_a_rotated_key_overlaps_and_the_keyring_alone_verifies_throughout(
    client, services, workspace, operator, member, deliverer, cli
):
    first = keyring(client, member[1])
    assert [k["until"] for k in first["keys"]] == [None]
    old = first["public_key"]
    with Receiver() as receiver:
        made = client.post(
            f"/api/v1/workspaces/{workspace.id}/webhooks",
            json={"url": receiver.url, "event_types": ["task.created"]},
            headers=bearer(operator[1]),
        ).json
        rotated = cli("webhook", "rotate-key", "--overlap", "3")
        assert rotated.exit_code == 0, rotated.output
        printed = json.loads(rotated.stdout)["keys"]
        new = printed[0]["public_key"]
        assert new != old and [k["public_key"] for k in printed] == [new, old]
        time.sleep(1.2)  # the running deliverer reads the key file again
        ring = keyring(client, member[1])
        assert ring["public_key"] == new and ring["keys"] == printed
        assert ring["keys"][1]["until"] is not None
        create(client, member[1], workspace_id=str(workspace.id), title="during")
        during = receiver.wait_for(lambda r: len(r) == 1)[0]
        assert signers(ring["keys"], during) == [new, old]
        Webhook(made["secret"]).verify(during.body, during.headers)
        time.sleep(3.2)  # the overlap ends: the old key signs no more
        after_ring = keyring(client, member[1])
        assert [k["public_key"] for k in after_ring["keys"]] == [new]
        create(client, member[1], workspace_id=str(workspace.id), title="after")
        after = receiver.wait_for(lambda r: len(r) == 2)[1]
    assert signers(after_ring["keys"], after) == [new]
    Webhook(made["secret"]).verify(after.body, after.headers)
    key_file = services.settings.webhook_key_path
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert old.removeprefix("whpk_") not in key_file.read_text()  # no private bytes print it
    assert len(key_file.read_text().split()) == 3  # current key, the old one and its end


def test_a_rotation_without_overlap_stops_the_old_key_at_once(
    client, services, workspace, member, cli
):
    old = keyring(client, member[1])["public_key"]
    rotated = cli("webhook", "rotate-key", "--overlap", "0")
    assert rotated.exit_code == 0, rotated.output
    time.sleep(1.2)  # this process reads the key file again
    ring = keyring(client, member[1])
    assert [k["public_key"] for k in ring["keys"]] == [ring["public_key"]]
    assert ring["public_key"] != old
    refused = cli("webhook", "rotate-key", "--overlap", "-1")
    assert refused.exit_code != 0 and "overlap" in refused.output.lower()
