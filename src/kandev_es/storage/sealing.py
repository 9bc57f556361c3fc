"""Sealed events (docs/auditing.md: Erasure): a task's free text is stored
encrypted under a key of that task's own, so forgetting the task deletes the
key and leaves every stored byte -- so every chain hash, leaf, checkpoint and
proof -- as it was.

Format 1: the event's JSON keeps every other member as before; the free-text
members (``SEALED_FIELDS``) are taken out of it and stored in one member

    "sealed": {"v": 1, "task": "<task id hex>", "fields": ["title", ...],
               "box": "<base64 of nonce (12 bytes) || AES-256-GCM ciphertext>"}

whose plaintext is the JSON object of the taken values by dotted path, and
whose associated data (``aad``) binds it to its task and event topic. An
event without ``sealed`` is format 0 (cleartext, written before the
upgrade) and decodes as it always did. With no key (forgotten, or lost) a
sealed field decodes as None: the task's free text is forgotten."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import Mapper, StoredEvent
from eventsourcing.utils import get_topic

from kandev_es.domain.identity import Identity
from kandev_es.domain.release import ReleaseOperation
from kandev_es.domain.task import Task

SEALED = "sealed"
FORMAT = 1
_AAD_TAG = b"kandev-es/sealed/v1\x00"
_TEXT = (("title",), ("description",))
# Topic -> (the paths of its free-text members, the path of its task's id:
# () for the event's originator).
SEALED_FIELDS: dict[str, tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]] = {
    get_topic(Task.Created): (_TEXT, ()),
    get_topic(Task.CreatedActive): (_TEXT, ()),
    get_topic(Task.Updated): ((("changes", "title"), ("changes", "description")), ()),
    get_topic(Identity.Claimed): ((("plan", "title"), ("plan", "description")), ("task_id",)),
    # A release's stored answer is the task's DTO (replayed on a retry).
    get_topic(ReleaseOperation.Recorded): (
        (("result", "title"), ("result", "description")), ("result", "id"),
    ),
}  # fmt: skip
# The events that start a task: its key is made with them.
NEW_TASK = frozenset(get_topic(c) for c in (Task.Created, Task.CreatedActive, Identity.Claimed))
# A sealed event's task, as the encoder writes its member (compact, in order).
_SEALED_TASK = re.compile(rb'"sealed":\{"v":1,"task":"([0-9a-f]{32})"')
# One encoder for every box (json.dumps with options makes one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
log = logging.getLogger("kandev_es.store")

# Reads the stored keys of some tasks (those it has): the recorder's select.
KeyReader = Callable[[list[uuid.UUID]], Mapping[uuid.UUID, bytes]]


def aad(task_id: uuid.UUID, topic: str) -> bytes:
    return _AAD_TAG + task_id.bytes + topic.encode()


def seal(state: dict[str, Any], topic: str, task_id: uuid.UUID, key: bytes) -> bool:
    """Take ``topic``'s free-text members out of ``state`` (a copy the caller
    owns; nested members are copied before they change) into its sealed
    member. False: it holds none of them (nothing sealed)."""
    paths = SEALED_FIELDS[topic][0]
    taken: dict[str, Any] = {}
    for path in paths:
        parent: Any = state
        for name in path[:-1]:
            parent = parent.get(name) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent:
            taken[".".join(path)] = None
    if not taken:
        return False
    for name in {path[0] for path in paths if len(path) > 1 and ".".join(path) in taken}:
        state[name] = dict(state[name])
    for dotted in taken:
        *parents, last = dotted.split(".")
        parent = state
        for name in parents:
            parent = parent[name]
        taken[dotted] = parent.pop(last)
    nonce = os.urandom(12)
    plain = _ENCODE(taken).encode()
    box = nonce + AESGCM(key).encrypt(nonce, plain, aad(task_id, topic))
    state[SEALED] = {
        "v": FORMAT, "task": task_id.hex, "fields": list(taken),
        "box": base64.b64encode(box).decode(),
    }  # fmt: skip
    return True


def unseal(state: dict[str, Any], topic: str, key: bytes | None) -> bool:
    """Put the sealed members back into ``state`` (None each when ``key`` is
    None or does not open the box). True: the values were recovered."""
    sealed = state.pop(SEALED)
    task_id = uuid.UUID(hex=sealed["task"])
    values: dict[str, Any] | None = None
    if key is not None:
        box = base64.b64decode(sealed["box"])
        try:
            values = json.loads(AESGCM(key).decrypt(box[:12], box[12:], aad(task_id, topic)))
        except InvalidTag:
            log.warning(
                "task %s: its data key does not open event %s; read as forgotten",
                task_id,
                topic.rsplit(".", 1)[-1],
            )
    for dotted in sealed["fields"]:
        *parents, last = dotted.split(".")
        parent = state
        for name in parents:
            parent = parent[name]
        parent[last] = None if values is None else values.get(dotted)
    return values is not None


def _task_of(state: Mapping[str, Any], path: tuple[str, ...], originator: Any) -> uuid.UUID | None:
    """The task whose key seals an event: its originator, or the id at
    ``path`` (None where there is none, e.g. a release that found no holder)."""
    if not path:
        return uuid.UUID(str(originator))
    value: Any = state
    for name in path:
        value = value.get(name) if isinstance(value, Mapping) else None
    return None if value is None else uuid.UUID(str(value))


def sealed_task(state: Mapping[str, Any]) -> uuid.UUID | None:
    """The task whose key seals a decoded event state, if sealed."""
    sealed = state.get(SEALED)
    return uuid.UUID(hex=sealed["task"]) if isinstance(sealed, Mapping) else None


class TaskKeys:
    """The tasks' data keys, read from the store for the read that decodes
    their events and kept no longer: a key deleted by a forget on any node is
    then gone for every later read on every node (a key kept in memory would
    still open a task forgotten elsewhere). A read of many events reads all
    their keys in one query first (``reading``); an event decoded outside
    such a read reads its key alone. Keys are never logged."""

    def __init__(self, reader: KeyReader | None = None) -> None:
        self.reader = reader
        self._local = threading.local()

    def get(self, task_id: uuid.UUID) -> bytes | None:
        scope: dict[uuid.UUID, bytes | None] | None = getattr(self._local, "scope", None)
        if scope is not None and task_id in scope:
            return scope[task_id]
        if self.reader is None:
            return None
        return self.reader([task_id]).get(task_id)

    def fetch(self, states: Iterable[bytes]) -> dict[uuid.UUID, bytes | None]:
        """The keys of the sealed events among ``states`` (stored bytes) not
        already in this thread's read, in one query (None: it has none)."""
        outer = getattr(self._local, "scope", None) or {}
        wanted = {m.group(1) for state in states if (m := _SEALED_TASK.search(state))}
        tasks = [task for h in wanted if (task := uuid.UUID(hex=h.decode())) not in outer]
        if not tasks or self.reader is None:
            return {}
        found = self.reader(tasks)
        return {task: found.get(task) for task in tasks}

    @contextmanager
    def held(self) -> Iterator[None]:
        """In this block (this thread: one request), the keys its reads fetch
        stay for its later reads instead of ending with each."""
        if getattr(self._local, "scope", None) is not None:  # already in a read
            yield
            return
        self._local.scope, self._local.held = {}, True
        try:
            yield
        finally:
            self._local.scope, self._local.held = None, False

    @contextmanager
    def using(self, keys: Mapping[uuid.UUID, bytes | None]) -> Iterator[None]:
        """In this block (this thread), decodes open their events with ``keys``
        (``fetch``'s) before asking the store for any other."""
        outer: dict[uuid.UUID, bytes | None] | None = getattr(self._local, "scope", None)
        if not keys:
            yield
            return
        if outer is not None and getattr(self._local, "held", False):
            outer.update(keys)  # kept till the held block ends
            yield
            return
        self._local.scope = {**(outer or {}), **keys}
        try:
            yield
        finally:
            self._local.scope = outer

    @contextmanager
    def reading(self, states: Iterable[bytes]) -> Iterator[None]:
        """``fetch`` and ``using`` in one: a read decoding ``states``."""
        with self.using(self.fetch(states)):
            yield


class SealingMapper(Mapper):  # type: ignore[type-arg]
    """The library's mapper, sealing the free text of the events that hold
    some (``SEALED_FIELDS``) under their task's key. A new task's key is made
    here and handed to the save (``new_keys``), which stores it in the same
    transaction as the events (storage/view_writes.py: task_keys)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys = TaskKeys()
        self._local = threading.local()

    @contextmanager
    def collecting(self, seal: bool = True) -> Iterator[dict[uuid.UUID, bytes]]:
        """Seal in this block, and collect the keys made for new tasks: the
        caller must store them with the events. Outside such a block (or with
        ``seal`` False: KANDEV_SEAL_FREE_TEXT off) events are stored in
        cleartext (format 0)."""
        made: dict[uuid.UUID, bytes] = {}
        self._local.made = made if seal else None
        try:
            yield made
        finally:
            self._local.made = None

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        topic = get_topic(type(domain_event))
        spec = SEALED_FIELDS.get(topic)
        made: dict[uuid.UUID, bytes] | None = getattr(self._local, "made", None)
        if spec is None or made is None:
            return super().to_stored_event(domain_event)
        state = dict(vars(domain_event))
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        class_version = getattr(type(domain_event), "class_version", 1)
        if class_version > 1:
            state["class_version"] = class_version
        task_id = _task_of(state, spec[1], originator_id)
        if task_id is not None:
            key = made.get(task_id) or self._key_of(task_id, topic, made)
            seal(state, topic, task_id, key)
        stored = self.transcoder.encode(state)
        if self.compressor:
            stored = self.compressor.compress(stored)
        if self.cipher:
            stored = self.cipher.encrypt(stored)
        return StoredEvent(
            originator_id=originator_id,
            originator_version=originator_version,
            topic=topic,
            state=stored,
        )

    def _key_of(self, task_id: uuid.UUID, topic: str, made: dict[uuid.UUID, bytes]) -> bytes:
        """A new task's new key; an existing task's stored one (a task written
        before the upgrade gets its first key with its first sealed event)."""
        key = None if topic in NEW_TASK else self.keys.get(task_id)
        if key is None:
            key = made[task_id] = AESGCM.generate_key(bit_length=256)
        return key

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        event = super().to_domain_event(stored_event)
        state = vars(event)
        task_id = sealed_task(state)
        if task_id is not None:
            unseal(state, stored_event.topic, self.keys.get(task_id))
        return event
