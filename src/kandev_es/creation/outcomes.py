"""The four outcomes of a create carrying an external ID (docs/api.md: Outcomes), and
the create answer: ``CreateResult.to_response`` builds it and
``CreateTaskResponseSchema`` is its contract (REST and MCP publish it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from marshmallow import fields, validate

from kandev_es.views import TaskSchema


class Outcome(StrEnum):
    CREATED = "created"
    FOUND_SETTLED = "found_settled"
    FOUND_UNSETTLED = "found_unsettled"
    CREATED_IDENTITY_LOST = "created_identity_lost"

    @property
    def deduplicated(self) -> bool:
        return self in (Outcome.FOUND_SETTLED, Outcome.FOUND_UNSETTLED)

    @property
    def creation_complete(self) -> bool:
        return self is not Outcome.FOUND_UNSETTLED


UNSETTLED_ADVICE = (
    "Another create owns this identity and has not finished. Proceed with this task id, "
    "poll the lookup until creation_complete is true, or escalate to a human. "
    "Never release the identity and create again."
)


@dataclass(frozen=True)
class CreateResult:
    outcome: Outcome
    task: Mapping[str, Any]  # read-only: Found answers share it
    # The private creation handle: only a request that Created gets one (AC-5).
    handle: str | None = None

    def to_response(self) -> dict[str, Any]:
        body = dict(self.task)
        body["outcome"] = self.outcome.value
        body["deduplicated"] = self.outcome.deduplicated
        body["creation_complete"] = self.outcome.creation_complete
        if self.handle is not None:
            body["creation_handle"] = self.handle
        if self.outcome is Outcome.FOUND_UNSETTLED:
            body["advice"] = UNSETTLED_ADVICE
        return body

    def to_lookup_response(self) -> dict[str, Any]:
        """The lookup's answer (REST and CLI): the task holding the identity and
        whether its creation finished."""
        body = dict(self.task)
        body["creation_complete"] = self.outcome.creation_complete
        return body


class CreateTaskResponseSchema(TaskSchema):
    outcome = fields.String(required=True, validate=validate.OneOf([o.value for o in Outcome]))
    deduplicated = fields.Boolean(required=True)
    creation_complete = fields.Boolean(
        required=True,
        metadata={
            "description": (
                "true when the task finished its synchronous creation. "
                "deduplicated=true with creation_complete=false means another create owns "
                "the identity: proceed with this task, poll the lookup, or escalate; never "
                "release and recreate."
            )
        },
    )
    advice = fields.String()
    creation_handle = fields.String(
        metadata={
            "description": (
                "private, only on created outcomes: read your own creation's step states "
                "at /api/v1/creations/{handle}"
            )
        }
    )
