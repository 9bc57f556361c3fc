"""A batch of creates, each item by the one create protocol (creation/):

1. the batch's authorization, before any item is read (404 for the whole batch);
2. per item: its external ID normalized (invalid: the item's error);
3. per window of items: ONE read of the workspace and every identity; a held
   identity is Found, with no side effect, before the item's body is read;
   an external ID an earlier item of the batch holds is that item's task,
   found (one task per identity, whatever the batch repeats);
4. the body validated (creation.validated_fields), only after the lookup missed;
5. effect-free items: office numbers drawn at once, each claimed and completed
   as an inline single create is (creation.claimed), and the whole window saved
   in ONE save guarded by the workspace's version -- its events, inline views
   and feed rows in one transaction, in item order. A lost version check
   (a concurrent create of one of the identities, the workspace changed) runs
   that window's items as single creates, which find or create each.
   Items with effects run as single creates, the durable step protocol.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.bulk.replay import BatchReplays
from kandev_es.bulk.request import Batch, load_batch
from kandev_es.bulk.results import BatchResult, ItemResult
from kandev_es.creation.found import as_kind
from kandev_es.creation.handles import new_secret
from kandev_es.creation.outcomes import CreateResult, Outcome
from kandev_es.creation.placement import Placement, requested
from kandev_es.creation.service import Claimed, CreationService
from kandev_es.creation.steps.registry import plan_step_names
from kandev_es.domain.external_id import identity_id, normalize_external_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.principal import Principal
from kandev_es.domain.release import validate_operation_id
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import (
    BatchRefused,
    Contended,
    EffectsInAtomicBatch,
    KandevError,
    StoreUnavailable,
    TaskNotCreated,
    ValidationFailed,
)
from kandev_es.observability import tracing

log = logging.getLogger("kandev_es.bulk")

# Items read in one query and saved in one save (the default mode): at most
# WINDOW items, and at most WINDOW_TEXT characters of their strings (a save's
# events, view rows and answers each hold every string of its items: a window
# of 500 items of 64 KiB descriptions held ~100 MB at once).
WINDOW = 500
WINDOW_TEXT = 4_000_000
ATOMIC_ATTEMPTS = 4


@dataclass
class _Item:
    """An item past steps 1-2, waiting for its lookup."""

    index: int
    body: dict[str, Any]
    external_id: str | None
    key: uuid.UUID | None


@dataclass
class _Claim:
    """An item whose lookup missed and whose body validated: to be claimed."""

    index: int
    external_id: str | None
    read: Identity | None
    fields: dict[str, Any]


@dataclass
class _Run:
    """One batch: its caller, workspace, items and what each got so far."""

    principal: Principal
    workspace_id: uuid.UUID
    items: list[dict[str, Any]]
    atomic: bool
    results: list[ItemResult | None]
    # External ID -> the index of the item of this batch that holds it.
    held: dict[str, int] = field(default_factory=dict)
    # (index, index of the earlier item with the same external ID)
    repeats: list[tuple[int, int]] = field(default_factory=list)
    pending: list[_Claim] = field(default_factory=list)
    # As the last window's lookup read it: the claims' admission.
    workspace: Workspace | None = None


class BatchService:
    def __init__(
        self, app: Tasks, creation: CreationService, max_items: int, lease_seconds: float
    ) -> None:
        self._app = app
        self.creation = creation
        self._max_items = max_items
        self._replays = BatchReplays(app, lease_seconds)

    def create_many(
        self, principal: Principal | None, body: Mapping[str, Any], key: str | None = None
    ) -> BatchResult:
        """The batch's answer. Its authorization first (step 1, from the
        body's ``workspace_id`` alone): refused, nothing else is read. With an
        ``Idempotency-Key`` (``key``), a replay answers the first run's."""
        workspace_id = self.creation.authorized_workspace_id(principal, body.get("workspace_id"))
        assert principal is not None
        batch = load_batch(body, self._max_items)
        if key is None:
            return self._processed(principal, workspace_id, batch)
        begun = self._replays.begin(workspace_id, validate_operation_id(key), body, batch)
        if isinstance(begun, BatchResult):
            return begun
        try:
            result = self._processed(principal, workspace_id, batch, self._replays.heartbeat(begun))
        except KandevError as error:
            self._replays.abandon(begun, error)
            raise
        self._replays.finish(begun, result)
        return result

    def _processed(
        self,
        principal: Principal,
        workspace_id: uuid.UUID,
        batch: Batch,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> BatchResult:
        """``heartbeat``: called after each window (an Idempotency-Key's lease)."""
        with tracing.span("batch", **{"kandev.batch.items": len(batch.items)}):
            if batch.atomic:
                results = self._atomic(principal, workspace_id, batch.items, heartbeat)
            else:
                run = self._run(principal, workspace_id, batch.items, atomic=False)
                for window in windows(batch.items):
                    self._window(run, window)
                    self._flush(run)
                    heartbeat()
                results = self._finished(run)
        answered: Counter[str] = Counter()
        for item in results:
            if item.error is not None:
                metrics.record_creation_error(item.error)
            else:
                answered[item.outcome] += 1
        for outcome, count in answered.items():  # one increment per outcome, not per item
            metrics.record_creation(outcome, count)
        return BatchResult(workspace_id, batch.atomic, results)

    @staticmethod
    def _run(
        principal: Principal, workspace_id: uuid.UUID, items: list[dict[str, Any]], atomic: bool
    ) -> _Run:
        return _Run(principal, workspace_id, items, atomic, [None] * len(items))

    def _atomic(
        self,
        principal: Principal,
        workspace_id: uuid.UUID,
        items: list[dict[str, Any]],
        heartbeat: Callable[[], None],
    ) -> list[ItemResult]:
        """Every item looked up and validated, then all saved in one save, or
        none: BatchRefused lists every item that would not be created or found."""
        for _ in range(ATOMIC_ATTEMPTS):
            run = self._run(principal, workspace_id, items, atomic=True)
            for window in windows(items):
                self._window(run, window)
                heartbeat()
            failures = [
                {"index": item.index, **item.error.to_dict()}
                for item in run.results
                if item is not None and item.error is not None
            ]
            if failures:
                raise BatchRefused(
                    f"{len(failures)} of {len(items)} items would not be created or found;"
                    " nothing was created",
                    failures=failures,
                )
            if self._flush(run, fall_back=False):
                return self._finished(run)
        raise Contended("the batch's identities kept changing; retry", attempts=ATOMIC_ATTEMPTS)

    # ----- steps 2-4, a window at a time -------------------------------------
    def _window(self, run: _Run, indexes: range) -> None:
        items = [item for item in (self._identified(run, index) for index in indexes) if item]
        keys = [item.key for item in items if item.key is not None]
        reads = self._read(run, keys)
        workspace = as_kind(reads.get(run.workspace_id), Workspace)
        if workspace is None or workspace.deleted:
            if indexes.start == 0:
                raise TaskNotCreated()  # the whole batch: nothing read
            for item in items:
                refused = TaskNotCreated()
                run.results[item.index] = ItemResult(item.index, error=refused)
            return
        run.workspace = workspace
        for item in items:
            self._look_up(run, item, workspace, reads)

    def _identified(self, run: _Run, index: int) -> _Item | None:
        """Steps 1-2 for one item: its workspace (the batch's), its external ID."""
        body = run.items[index]
        raw_workspace = body.get("workspace_id")
        try:
            if raw_workspace is not None and (
                requested(run.principal, raw_workspace) != run.workspace_id
            ):
                raise ValidationFailed(
                    "an item's workspace_id must be the batch's, or absent", field="workspace_id"
                )
            external_id = normalize_external_id(body.get("external_id"))
        except KandevError as error:
            run.results[index] = ItemResult(index, error=error)
            return None
        if external_id is not None and external_id in run.held:
            run.repeats.append((index, run.held[external_id]))
            return None
        if external_id is not None:
            run.held[external_id] = index
            key: uuid.UUID | None = identity_id(run.workspace_id, external_id)
        else:
            key = None
        return _Item(index, body, external_id, key)

    def _read(self, run: _Run, keys: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
        """Step 3: the workspace and the identities in one query, then the
        holders' tasks in one more. (Not the single create's guess of each
        holder from the snapshots: a copy of each snapshot per guess cost a
        window of found items more than the second query.)"""
        if keys:
            self.creation.require_attested()
        reads: dict[uuid.UUID, Any] = self._app.read_many([run.workspace_id, *keys], share=False)
        missing = []
        for key in keys:
            identity = as_kind(reads.get(key), Identity)
            holder = identity.holder if identity is not None else None
            if holder is not None and holder.task_id not in reads:
                missing.append(holder.task_id)
        if missing:
            reads.update(self._app.read_many(missing, share=False))
        return reads

    def _look_up(
        self, run: _Run, item: _Item, workspace: Workspace, reads: dict[uuid.UUID, Any]
    ) -> None:
        """Step 3 (Found, no side effect), then step 4, for one item."""
        identity = as_kind(reads.get(item.key), Identity) if item.key is not None else None
        found = self.creation.holders.found(identity, reads)
        if found is not None:
            run.results[item.index] = ItemResult(item.index, found)
            return
        try:
            fields = self.creation.validated_fields(item.body, workspace)
        except KandevError as error:
            run.results[item.index] = ItemResult(item.index, error=error)
            return
        if not plan_step_names(fields):
            run.pending.append(_Claim(item.index, item.external_id, identity, fields))
        elif run.atomic:
            run.results[item.index] = ItemResult(
                item.index,
                error=EffectsInAtomicBatch(
                    "an item with effects (repositories, attachments, start_agent, or a workspace"
                    " WIP limit) cannot be in an atomic batch; send it without atomic",
                    field="tasks",
                ),
            )
        else:
            self._flush(run)  # the items before it first: task.created in item order
            run.results[item.index] = self._single(run, item.index)

    # ----- step 5 and the claims --------------------------------------------
    def _flush(self, run: _Run, fall_back: bool = True) -> bool:
        """The pending claims, saved in one save; False (atomic) or each run
        as a single create (``fall_back``) when its version check fails."""
        pending, run.pending = run.pending, []
        if not pending:
            return True
        workspace = run.workspace
        assert workspace is not None
        to_claim: list[tuple[_Claim, Identity]] = []
        for claim in pending:
            identity = self.creation.identity_to_claim(workspace.id, claim.external_id, claim.read)
            found = self.creation.holders.found(identity)  # claimed since the lookup
            if found is not None:
                run.results[claim.index] = ItemResult(claim.index, found)
            else:
                to_claim.append((claim, identity))
        # Numbers only for the items claimed here: none lost to an item found.
        numbers = self._app.next_office_numbers(workspace.id, len(to_claim))
        claims: list[tuple[_Claim, Claimed]] = []
        aggregates: list[Any] = []
        for (claim, identity), number in zip(to_claim, numbers, strict=True):
            plan = self.creation.plan(
                run.principal, workspace, claim.external_id, number, claim.fields
            )
            claimed = self.creation.claimed(
                run.principal, plan, new_secret(), identity, completed=True
            )
            claims.append((claim, claimed))
            aggregates.extend((identity, claimed.task))
        if not claims:
            return True
        try:
            self._app.save_atomically(
                *aggregates,
                unchanged={workspace.id: workspace.version},
                dtos={c.task.id: c.dto for _, c in claims if c.dto is not None},
            )
        except VersionConflict:
            log.info("batch window of %d lost a version check", len(pending))
            if not fall_back:
                return False
            for claim, _ in claims:
                run.results[claim.index] = self._single(run, claim.index)
            return True
        for claim, claimed in claims:
            run.results[claim.index] = ItemResult(claim.index, self.creation.answer(claimed))
        return True

    def _single(self, run: _Run, index: int) -> ItemResult:
        """The item as a single create: the whole protocol, its steps included."""
        try:
            placed = Placement(run.workspace_id)
            result = self.creation.create(run.principal, run.items[index], placed)
        except StoreUnavailable:
            raise  # the batch answers 503; retrying it is safe by external ID
        except KandevError as error:
            return ItemResult(index, error=error)
        return ItemResult(index, result)

    def _finished(self, run: _Run) -> list[ItemResult]:
        """Each repeated external ID answered as found: the earlier item's task."""
        for index, earlier in run.repeats:
            first = run.results[earlier]
            assert first is not None
            if first.result is None:
                # The earlier item failed: this one is a create of its own.
                run.results[index] = self._single(run, index)
                continue
            settled = first.result.outcome.creation_complete
            outcome = Outcome.FOUND_SETTLED if settled else Outcome.FOUND_UNSETTLED
            run.results[index] = ItemResult(index, CreateResult(outcome, first.result.task))
        done = [result for result in run.results if result is not None]
        assert len(done) == len(run.items)
        return done


def windows(items: list[dict[str, Any]]) -> Iterator[range]:
    """The items' windows, in order: at most WINDOW items and WINDOW_TEXT
    characters of their top-level strings each (one item at least)."""
    start, text = 0, 0
    for index, item in enumerate(items):
        size = sum(len(value) for value in item.values() if isinstance(value, str))
        if index > start and (index - start >= WINDOW or text + size > WINDOW_TEXT):
            yield range(start, index)
            start, text = index, 0
        text += size
    if start < len(items):
        yield range(start, len(items))
