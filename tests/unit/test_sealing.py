"""The sealed event format (storage/sealing.py, docs/auditing.md: Erasure):
free-text members go into one AES-GCM box bound to its task and topic, come
back exactly, and read as None without the key or under another event's name."""

from __future__ import annotations

import copy
import json
import uuid

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.utils import get_topic

from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task
from kandev_es.storage.sealing import SEALED, seal, unseal

CLAIMED = get_topic(Identity.Claimed)
UPDATED = get_topic(Task.Updated)


def claimed_state():
    return {
        "tenure": 1,
        "task_id": uuid.uuid4(),
        "plan": {"identifier": "KAN-1", "title": "Jane Doe", "description": "jane@x"},
    }


def test_a_sealed_state_opens_to_what_it_was_and_leaves_the_caller_plan_alone():
    key = AESGCM.generate_key(bit_length=256)
    state = claimed_state()
    plan = state["plan"]
    original = copy.deepcopy(state)
    assert seal(state, CLAIMED, state["task_id"], key)
    assert plan == original["plan"]  # the manifest the caller shares is not changed
    assert "title" not in state["plan"] and "Jane" not in json.dumps(state, default=str)
    assert state[SEALED]["fields"] == ["plan.title", "plan.description"]
    assert unseal(state, CLAIMED, key)
    assert state == original


def test_without_the_key_or_under_another_name_the_fields_read_as_none():
    key = AESGCM.generate_key(bit_length=256)
    state = claimed_state()
    seal(state, CLAIMED, state["task_id"], key)
    lost, moved = copy.deepcopy(state), copy.deepcopy(state)
    assert not unseal(lost, CLAIMED, None)
    assert (lost["plan"]["title"], lost["plan"]["description"]) == (None, None)
    assert not unseal(moved, UPDATED, key)  # the box is bound to its topic
    assert moved["plan"]["title"] is None
    assert not unseal(state, CLAIMED, AESGCM.generate_key(bit_length=256))


def test_an_edit_seals_only_the_free_text_it_changes():
    key = AESGCM.generate_key(bit_length=256)
    task_id = uuid.uuid4()
    step = {"changes": {"workflow_step": "doing"}}
    assert not seal(step, UPDATED, task_id, key) and SEALED not in step
    both = {"changes": {"workflow_step": "doing", "description": "call Jane"}}
    assert seal(both, UPDATED, task_id, key)
    assert both["changes"] == {"workflow_step": "doing"}
    assert both[SEALED]["fields"] == ["changes.description"]
    unseal(both, UPDATED, key)
    assert both["changes"] == {"workflow_step": "doing", "description": "call Jane"}


def test_boxes_made_with_one_shared_cipher_open_with_the_key_each_with_its_own_nonce():
    key = AESGCM.generate_key(bit_length=256)
    cipher = AESGCM(key)  # what a save shares between a new task's Claimed and Created
    first, second = claimed_state(), claimed_state()
    second["task_id"] = first["task_id"]
    original = copy.deepcopy(first)
    assert seal(first, CLAIMED, first["task_id"], cipher)
    assert seal(second, CLAIMED, second["task_id"], cipher)
    assert first[SEALED]["box"][:16] != second[SEALED]["box"][:16]  # a random nonce per box
    assert unseal(first, CLAIMED, key) and first == original
