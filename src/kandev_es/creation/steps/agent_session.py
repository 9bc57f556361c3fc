"""Agent session: the durable record that this task has an agent run."""

from __future__ import annotations

import contextlib
from typing import Any

from kandev_es.application import VersionConflict
from kandev_es.creation.steps.base import SHARED_ATTEMPTS, SHARED_CONTENDED, StepContext
from kandev_es.domain.agent_session import AgentSession, session_id_for


class AgentSessionStep:
    name = "agent_session"

    def _load(self, ctx: StepContext) -> AgentSession | None:
        return ctx.app.load(session_id_for(ctx.task_id), AgentSession)

    def run(self, ctx: StepContext) -> dict[str, Any]:
        existing = self.reconcile(ctx)
        if existing is not None:
            return existing
        profile = ctx.manifest.get("agent_profile") or "default"
        ctx.fence()  # held still? an owner that lost its lease makes nothing
        # A conflict means an earlier attempt of this very step opened it.
        with contextlib.suppress(VersionConflict):
            ctx.app.save_atomically(AgentSession.open(ctx.task_id, ctx.workspace_id, profile))
        evidence = self.reconcile(ctx)
        assert evidence is not None
        return evidence

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        session = self._load(ctx)
        if session is None or session.closed:
            return None
        return {"session_id": str(session.id), "run_id": session.run_id, "profile": session.profile}

    def compensate(self, ctx: StepContext) -> None:
        if self._load(ctx) is None:
            return

        def close(session: AgentSession | None) -> None:
            assert session is not None
            session.close("creation aborted")

        ctx.app.retry_on_conflict(
            lambda: self._load(ctx), close, attempts=SHARED_ATTEMPTS, contended=SHARED_CONTENDED
        )

    def absent(self, ctx: StepContext) -> bool:
        return self.reconcile(ctx) is None
