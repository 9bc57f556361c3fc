"""A batch's answer: one result per item in request order -- the single
create's answer, or the item's own typed error -- and counts by outcome.
``BatchCreateResponseSchema`` is its contract (the OpenAPI publishes it)."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, fields, validate

from kandev_es.creation.outcomes import CreateResult, CreateTaskResponseSchema, Outcome
from kandev_es.errors import KandevError, http_status

FAILED = "failed"
OUTCOMES = [*(outcome.value for outcome in Outcome), FAILED]


@dataclass(frozen=True)
class ItemResult:
    index: int
    result: CreateResult | None = None
    error: KandevError | None = None

    @property
    def outcome(self) -> str:
        return self.result.outcome.value if self.result is not None else FAILED

    @property
    def status(self) -> int:
        return http_status(self.error) if self.error is not None else 200

    def to_response(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"index": self.index, "status": self.status}
        answer["outcome"] = self.outcome
        if self.result is not None:
            answer["result"] = self.result.to_response()
        else:
            assert self.error is not None
            answer["error"] = self.error.to_dict()
        return answer


@dataclass(frozen=True)
class BatchResult:
    workspace_id: uuid.UUID
    atomic: bool
    items: list[ItemResult]

    def summary(self) -> dict[str, int]:
        counts = Counter(item.outcome for item in self.items)
        return {"total": len(self.items), **{name: counts[name] for name in OUTCOMES}}

    def to_response(self) -> dict[str, Any]:
        return {
            "workspace_id": str(self.workspace_id),
            "atomic": self.atomic,
            "summary": self.summary(),
            "results": [item.to_response() for item in self.items],
        }


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
