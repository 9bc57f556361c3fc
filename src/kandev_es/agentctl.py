"""The agentctl client: an agent creates a task over HTTP with the run
credential its launch put in its environment (stdlib only, no server code)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from kandev_es.config import RunCredential

TASK_CREATE_PATH = "/api/v1/agentctl/tasks"
RUN_ID_HEADER = "X-Kandev-Run-Id"
SUCCESS_OUTCOMES = frozenset(
    {"created", "found_settled", "found_unsettled", "created_identity_lost"}
)
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.body.get("outcome") in SUCCESS_OUTCOMES


def task_create(credential: RunCredential, body: dict[str, Any]) -> Answer:
    """POST the create; every answer, error or not, comes back as JSON."""
    request = urllib.request.Request(
        credential.api_url.rstrip("/") + TASK_CREATE_PATH,
        data=json.dumps(body).encode("utf-8"),
        method="POST",
        headers={
            "Authorization": f"Bearer {credential.token}",
            RUN_ID_HEADER: credential.run_id,
            "Content-Type": "application/json",
            # The agent's launch span (TRACEPARENT): this create joins its trace.
            **({"traceparent": credential.traceparent} if credential.traceparent else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return Answer(response.status, _json(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(error.code, _json(error.read()))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return Answer(0, {"error": "unreachable", "message": f"{credential.api_url}: {reason}"})


def _json(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {"error": "bad_answer", "message": raw[:500].decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"error": "bad_answer", "message": str(parsed)}
