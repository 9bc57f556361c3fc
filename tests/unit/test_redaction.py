"""erasure/redaction.py's rewrite of a cleartext (format 0) event: the free
text of the task (or an upload it claimed) null, everything else byte for
byte as the JSON it was; nothing for a sealed event or another task's."""

from __future__ import annotations

import json
import uuid

from eventsourcing.utils import get_topic

from kandev_es.domain.identity import Identity
from kandev_es.domain.release import ReleaseOperation
from kandev_es.domain.task import Task
from kandev_es.erasure.redaction import redacted_state

TASK = uuid.UUID("9a52e19f-f02f-4db4-be71-9474495fbb8d")
OTHER = uuid.uuid4()


def state(document):
    return json.dumps(document, separators=(",", ":")).encode()


def test_a_created_loses_its_title_and_description_and_nothing_else():
    old = {"title": "sealed", "description": "Jane Doe", "workflow_step": "backlog"}
    new = redacted_state(get_topic(Task.Created), state(old), {TASK}, TASK)
    assert new is not None
    assert json.loads(new) == {"title": None, "description": None, "workflow_step": "backlog"}
    assert redacted_state(get_topic(Task.Created), new, {TASK}, TASK) is None  # done already


def test_a_claimed_and_a_release_answer_of_the_task_only():
    claimed = {"task_id": {"_type_": "uuid_hex", "_data_": TASK.hex},
               "plan": {"title": "Jane", "description": "", "identifier": "KAN-1"}}  # fmt: skip
    new = redacted_state(get_topic(Identity.Claimed), state(claimed), {TASK}, OTHER)
    assert new is not None and json.loads(new)["plan"] == {
        "title": None, "description": None, "identifier": "KAN-1",
    }  # fmt: skip
    assert redacted_state(get_topic(Identity.Claimed), state(claimed), {OTHER}, OTHER) is None
    answer = {"result": {"id": str(TASK), "title": "Jane", "description": None}}
    new = redacted_state(get_topic(ReleaseOperation.Recorded), state(answer), {TASK}, OTHER)
    assert new is not None and json.loads(new)["result"]["title"] is None


def test_a_sealed_event_or_one_without_free_text_is_left_alone():
    sealed = {"sealed": {"v": 1, "task": TASK.hex, "fields": ["title"], "box": "AA=="}}
    assert redacted_state(get_topic(Task.Created), state(sealed), {TASK}, TASK) is None
    assert redacted_state(get_topic(Task.Deleted), state({"title": "x"}), {TASK}, TASK) is None


def test_a_replay_reads_no_names_from_a_statement_that_is_not_one():
    """A Forgotten event whose statement was tampered with into something that
    is not a signed note: a replayed forget rewrites nothing more (the audit
    names the statement), instead of failing with an untyped error (a 500)."""
    from types import SimpleNamespace

    from kandev_es.erasure.redaction import named

    for note in ("not a note", "kandev-es/redaction-statement/v1\nx\n\n— k AAAA\n"):
        event = SimpleNamespace(
            topic=get_topic(Task.Forgotten), state=state({"reason": "r", "redactions": note})
        )
        assert named([event]) == set()
