"""Attachment file names and erasure (issue 47; docs/auditing.md: Erasure), on
both backends: an upload's file name is stored sealed under a key of the
attachment's own; forgetting the task that claimed it records the upload's
Forgotten event and deletes that key in the same save, so every process --
this one, a fresh one, one that had read the name before -- answers it as
null, and after the documented VACUUM steps the name is nowhere in the store."""

from __future__ import annotations

import uuid

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.attachment import Attachment, attachment_id_for
from tests.integration import helpers
from tests.integration.helpers import create
from tests.integration.test_forget import MARKER, forget, nowhere_in_store

NAME = f"{MARKER}-passport.pdf"


def upload(client, workspace, secret, content: bytes, name: str = NAME):
    return helpers.upload(client, workspace, secret, content, name, "application/pdf")


def stored_uploads(services, attachment_id):
    return [
        bytes(e.state)
        for e in services.app.recorder.select_events(attachment_id)
        if e.topic.endswith("Attachment.Uploaded")
    ]


def claimed_upload(client, services, workspace, member, content=b"scan of a passport"):
    """An upload named with the marker, claimed by a new task."""
    uploaded = upload(client, workspace, member[1], content)
    made = create(client, member[1], title="visa", attachments=[uploaded["id"]])
    assert made.status_code == 200, made.json
    attachment_id = attachment_id_for(workspace.id, uploaded["sha256"])
    return made.json["id"], attachment_id, uploaded


def test_a_file_name_is_stored_sealed_and_reads_back(client, services, workspace, member):
    uploaded = upload(client, workspace, member[1], b"a scan")
    assert uploaded["filename"] == NAME
    attachment_id = attachment_id_for(workspace.id, uploaded["sha256"])
    [state] = stored_uploads(services, attachment_id)
    assert MARKER.encode() not in state and b'"sealed"' in state
    again = upload(client, workspace, member[1], b"a scan", name="other.pdf")
    assert again["filename"] == NAME  # the same content: the stored upload
    fresh = bootstrap(services.settings)  # a process that holds no key: reads it stored
    try:
        assert fresh.attachments.get(workspace.id, uploaded["id"]).filename == NAME
    finally:
        fresh.close()


def test_forgetting_the_task_forgets_the_file_name_on_every_node(
    client, services, workspace, member, operator
):
    other = bootstrap(services.settings)  # another node that read the name before
    try:
        task_id, attachment_id, uploaded = claimed_upload(client, services, workspace, member)
        assert other.attachments.get(workspace.id, uploaded["id"]).filename == NAME
        before = stored_uploads(services, attachment_id)
        answer = forget(client, operator[1], task_id)
        assert answer.status_code == 200, answer.json
        assert stored_uploads(services, attachment_id) == before  # its bytes unchanged
        assert other.attachments.get(workspace.id, uploaded["id"]).filename is None
        assert other.app.keys.get(attachment_id) is None
    finally:
        other.close()
    assert services.app.recorder.select_task_keys([attachment_id, uuid.UUID(task_id)]) == {}
    again = upload(client, workspace, member[1], b"scan of a passport")
    assert again["filename"] is None and again["claimed_by"] == task_id
    loaded = services.app.load(attachment_id, Attachment)
    assert loaded is not None and loaded.forgotten and loaded.claimed_by == uuid.UUID(task_id)
    replayed = forget(client, operator[1], task_id)
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"


def test_an_upload_the_task_did_not_claim_keeps_its_name(
    client, services, workspace, member, operator
):
    task_id, _, _ = claimed_upload(client, services, workspace, member)
    kept = upload(client, workspace, member[1], b"someone else's file", name="kept.txt")
    assert forget(client, operator[1], task_id).status_code == 200
    assert services.attachments.get(workspace.id, kept["id"]).filename == "kept.txt"


def test_the_file_name_is_nowhere_in_the_store_after_the_documented_steps(
    client, services, settings, workspace, member, operator
):
    task_id, _, _ = claimed_upload(client, services, workspace, member)
    assert forget(client, operator[1], task_id).status_code == 200
    services.close()
    nowhere_in_store(settings)
