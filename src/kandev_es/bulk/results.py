"""A batch's answer: one result per item in request order -- the single
create's answer, or the item's own typed error -- and counts by outcome.
``BatchCreateResponseSchema`` is its contract (the OpenAPI publishes it)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, fields, validate

from kandev_es.creation.outcomes import CreateResult, CreateTaskResponseSchema, Outcome
from kandev_es.errors import KandevError, http_status

FAILED = "failed"
OUTCOMES = [*(outcome.value for outcome in Outcome), FAILED]


@dataclass(frozen=True)
class ItemResult:
    """One item's answer: ``result``, or its ``error`` -- or, replayed, the
    error as first answered (``stored_error``: its status and body)."""

    index: int
    result: CreateResult | None = None
    error: KandevError | None = None
    stored_error: tuple[int, dict[str, Any]] | None = None

    @property
    def outcome(self) -> str:
        return self.result.outcome.value if self.result is not None else FAILED

    @property
    def status(self) -> int:
        if self.stored_error is not None:
            return self.stored_error[0]
        return http_status(self.error) if self.error is not None else 200

    def error_body(self) -> dict[str, Any]:
        if self.stored_error is not None:
            return self.stored_error[1]
        assert self.error is not None
        return self.error.to_dict()

    def to_response(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"index": self.index, "status": self.status}
        answer["outcome"] = self.outcome
        if self.result is not None:
            answer["result"] = self.result.to_response()
        else:
            answer["error"] = self.error_body()
        return answer

    def compact(self) -> dict[str, Any]:
        """What a replay needs of this answer (BatchOperation.Finished)."""
        kept: dict[str, Any] = {"index": self.index, "status": self.status}
        kept["outcome"] = self.outcome
        if self.result is not None:
            kept["task_id"] = str(self.result.task["id"])
        else:
            kept["error"] = self.error_body()
        return kept

    @classmethod
    def replayed(
        cls, kept: dict[str, Any], tasks: dict[uuid.UUID, Mapping[str, Any]]
    ) -> ItemResult:
        """The item as first answered, its task as it is now (no creation
        handle: only its hash was ever stored)."""
        index = int(kept["index"])
        if "task_id" not in kept:
            return cls(index, stored_error=(int(kept["status"]), dict(kept["error"])))
        task = tasks[uuid.UUID(kept["task_id"])]
        return cls(index, CreateResult(Outcome(kept["outcome"]), task))


@dataclass(frozen=True)
class BatchResult:
    workspace_id: uuid.UUID
    atomic: bool
    items: list[ItemResult]
    replayed: bool = False

    def summary(self) -> dict[str, int]:
        counts = Counter(item.outcome for item in self.items)
        return {"total": len(self.items), **{name: counts[name] for name in OUTCOMES}}

    def to_response(self, with_results: bool = True) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "workspace_id": str(self.workspace_id),
            "atomic": self.atomic,
            "summary": self.summary(),
        }
        if with_results:
            answer["results"] = [item.to_response() for item in self.items]
        return answer


class BatchItemErrorSchema(Schema):
    error = fields.String(required=True, metadata={"description": "machine-readable code"})
    message = fields.String()
    details = fields.Dict()


class BatchItemResultSchema(Schema):
    index = fields.Integer(required=True, metadata={"description": "the item's place in tasks"})
    status = fields.Integer(
        required=True,
        metadata={"description": "what the single create would have answered: 200, or the error's"},
    )
    outcome = fields.String(required=True, validate=validate.OneOf(OUTCOMES))
    result = fields.Nested(
        CreateTaskResponseSchema, metadata={"description": "the single create's answer"}
    )
    error = fields.Nested(BatchItemErrorSchema, metadata={"description": "the item's typed error"})


class BatchSummarySchema(Schema):
    total = fields.Integer(required=True)
    created = fields.Integer(required=True)
    found_settled = fields.Integer(required=True)
    found_unsettled = fields.Integer(required=True)
    created_identity_lost = fields.Integer(required=True)
    failed = fields.Integer(required=True)


class BatchCreateResponseSchema(Schema):
    workspace_id = fields.UUID(required=True)
    atomic = fields.Boolean(required=True)
    summary = fields.Nested(BatchSummarySchema, required=True)
    results = fields.List(
        fields.Nested(BatchItemResultSchema),
        required=True,
        metadata={"description": "one per item, in request order"},
    )
