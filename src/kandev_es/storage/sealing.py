"""Sealed events (docs/auditing.md: Erasure): a task's free text is stored
encrypted under a key of that task's own, so forgetting the task deletes the
key and leaves every stored byte -- so every chain hash, leaf, checkpoint and
proof -- as it was.

Format 1: the event's JSON keeps every other member as before; the free-text
members (``SEALED_FIELDS``) are taken out of it and stored in one member

    "sealed": {"v": 1, "task": "<task id hex>", "fields": ["title", ...],
               "box": "<base64 of nonce (12 bytes) || AES-256-GCM ciphertext>"}

(an uploaded attachment's file name: "task" is the attachment's id, whose key
is deleted with the task that claimed it)

whose plaintext is the JSON object of the taken values by dotted path, and
whose associated data (``aad``) binds it to its task and event topic. An
event without ``sealed`` is format 0 (cleartext, written before the
upgrade) and decodes as it always did. With no key (forgotten, or lost) a
sealed field decodes as None: the task's free text is forgotten."""

from __future__ import annotations

import base64
import json
import json.encoder
import logging
import os
import re
import threading
import uuid
from base64 import b64encode
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import Mapper, StoredEvent
from eventsourcing.utils import get_topic

from kandev_es.domain.attachment import Attachment
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
    # An upload's file name, under a key of the attachment's own (there is no
    # task yet), deleted when the task that claimed it is forgotten.
    get_topic(Attachment.Uploaded): ((("filename",),), ()),
}  # fmt: skip
# The events that start a task (or an attachment): its key is made with them.
NEW_TASK = frozenset(
    get_topic(c) for c in (Task.Created, Task.CreatedActive, Identity.Claimed, Attachment.Uploaded)
)
KEY_BYTES = 32  # AES-256
# A sealed event's task, as the encoder writes its member (compact, in order).
_SEALED_TASK = re.compile(rb'"sealed":\{"v":1,"task":"([0-9a-f]{32})"')
# One encoder for every box, made once: json.dumps with options makes a
# JSONEncoder per call, and its encode() a C encoder per call. A box's values
# are a flat object (no cycle to look for); the bytes are the same.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_BOX_ENCODER: Any = _C_ENCODER and _C_ENCODER(
    None, json.JSONEncoder().default, json.encoder.encode_basestring, None,
    ":", ",", False, False, True,
)  # fmt: skip


def _encode_box(values: dict[str, Any]) -> str:
    if _BOX_ENCODER is None:  # CPython without its C accelerator
        return json.dumps(values, separators=(",", ":"), ensure_ascii=False)
    return "".join(_BOX_ENCODER(values, 0))


log = logging.getLogger("kandev_es.store")

# Reads the stored keys of some tasks (those it has): the recorder's select.
KeyReader = Callable[[list[uuid.UUID]], Mapping[uuid.UUID, bytes]]


def aad(task_id: uuid.UUID, topic: str) -> bytes:
    return _AAD_TAG + task_id.bytes + topic.encode()


def _holders(
    fields: dict[str, tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]],
) -> dict[str, tuple[str | None, tuple[tuple[str, str], ...]]]:
    """Each topic's free-text members as seal() walks them: the one member
    holding them (None: the state itself) and their (name, dotted path)s."""
    holders: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {}
    for topic, (paths, _) in fields.items():
        parents = {path[:-1] for path in paths}
        if len(parents) != 1 or len(next(iter(parents))) > 1:
            raise ValueError(f"{topic}: its sealed fields must share one holder, at most 1 deep")
        parent = next(iter(parents))
        holders[topic] = (parent[0] if parent else None, tuple((p[-1], ".".join(p)) for p in paths))
    return holders


_HOLDERS = _holders(SEALED_FIELDS)


def seal(state: dict[str, Any], topic: str, task_id: uuid.UUID, key: bytes | AESGCM) -> bool:
    """Take ``topic``'s free-text members out of ``state`` (a copy the caller
    owns; a nested member is copied before it changes) into its sealed
    member. False: it holds none of them (nothing sealed). ``key``: the data
    key, or an AESGCM made with it (the caller's, for several boxes)."""
    parent, names = _HOLDERS[topic]
    holder = state if parent is None else state.get(parent)
    if not isinstance(holder, dict):
        return False
    present = [(name, dotted) for name, dotted in names if name in holder]
    if not present:
        return False
    if parent is not None:
        holder = state[parent] = dict(holder)
    taken = {dotted: holder.pop(name) for name, dotted in present}
    nonce = os.urandom(12)
    cipher = key if isinstance(key, AESGCM) else AESGCM(key)
    box = cipher.encrypt(nonce, _encode_box(taken).encode(), aad(task_id, topic))
    state[SEALED] = {
        "v": FORMAT, "task": task_id.hex, "fields": list(taken),
        "box": b64encode(nonce + box).decode(),
    }  # fmt: skip
    return True


def holds_text(state: Mapping[str, Any], topic: str) -> bool:
    """Whether ``state`` holds a value in one of ``topic``'s free-text members.
    One whose members are all None (what a forgotten task's release answer
    holds) is stored as it is: sealing nothing would make a forgotten task a
    new data key, which its audit would find stored (its key must be gone)."""
    parent, names = _HOLDERS[topic]
    holder = state if parent is None else state.get(parent)
    return isinstance(holder, Mapping) and any(holder.get(name) is not None for name, _ in names)


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
    value: Any = originator
    if path:
        value = state
        for name in path:
            value = value.get(name) if isinstance(value, Mapping) else None
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(str(value))


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
        # One AESGCM per task in the block: a create seals its plan (Claimed)
        # and its task (Created) under the same key.
        self._local.ciphers = {}
        try:
            yield made
        finally:
            self._local.made = self._local.ciphers = None

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
        if task_id is not None and holds_text(state, topic):
            seal(state, topic, task_id, self._cipher(task_id, topic, made))
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

    def _cipher(self, task_id: uuid.UUID, topic: str, made: dict[uuid.UUID, bytes]) -> AESGCM:
        """The AESGCM of the task's key: a new task's new key; an existing
        task's stored one (a task written before the upgrade gets its first
        key with its first sealed event)."""
        ciphers: dict[uuid.UUID, AESGCM] = self._local.ciphers
        cipher = ciphers.get(task_id)
        if cipher is None:
            key = made.get(task_id)
            if key is None and topic not in NEW_TASK:
                key = self.keys.get(task_id)
            if key is None:
                # 256 bits from the kernel's CSPRNG, as AESGCM.generate_key
                # makes them, without its detour (28 of 50 us a create's).
                key = made[task_id] = os.urandom(KEY_BYTES)
            cipher = ciphers[task_id] = AESGCM(key)
        return cipher

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        event = super().to_domain_event(stored_event)
        state = vars(event)
        task_id = sealed_task(state)
        if task_id is not None:
            unseal(state, stored_event.topic, self.keys.get(task_id))
        return event
