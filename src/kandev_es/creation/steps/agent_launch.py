"""Agent launch: a real subprocess from the configured command, detached into
its own session so it outlives the web worker. The pidfile is the durable
witness; without one, the world (/proc) is asked whether the run exists."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kandev_es.agent.census import running_launches
from kandev_es.agent.processes import await_exec, processes_for_run, stop_run
from kandev_es.application import Tasks
from kandev_es.config import Settings, agent_environment, data_path
from kandev_es.creation.steps.base import RunCredentials, StepContext, StepFailed
from kandev_es.creation.steps.repository import RepositoryStep
from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.token import RunCredentialRevoked
from kandev_es.errors import AgentLaunchFailed, AgentLimitReached
from kandev_es.observability import tracing

log = logging.getLogger(__name__)


def _reap(
    process: subprocess.Popen[bytes], app: Tasks, credentials: RunCredentials, run_id: str
) -> None:
    process.wait()
    with app.unless_closed() as usable:
        if not usable:  # shutting down: the expiry ends the credential
            return
        try:
            credentials.revoke_run(run_id, "agent_exited")
        except Exception:  # store down: the expiry still bounds the credential
            log.warning("could not revoke the run credential of %s", run_id, exc_info=True)


def agent_limit_refusal(
    settings: Settings, workspace_id: str, started_by_run: str | None
) -> AgentLimitReached | None:
    """Why run ``started_by_run`` may not start one more agent in the workspace
    now, or None. Only agents started through run credentials are bounded, by
    what is running now: KANDEV_MAX_AGENTS_PER_RUN of the starting run's own,
    KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE in the workspace. The create protocol
    asks before its claim (a refusal stores nothing), the launch asks again
    under the launch lock (so concurrent creates cannot overshoot)."""
    if started_by_run is None:
        return None
    running = [r for r in running_launches(data_path(settings, "agents")) if r.started_by_run]
    own = sum(1 for launch in running if launch.started_by_run == started_by_run)
    if own >= settings.max_agents_per_run:
        return AgentLimitReached(
            f"this run already has {own} running agents (limit {settings.max_agents_per_run})",
            scope="run", limit=settings.max_agents_per_run, running=own,
        )
    limit = settings.max_run_agents_per_workspace
    in_workspace = sum(1 for launch in running if launch.workspace_id == workspace_id)
    if in_workspace >= limit:
        return AgentLimitReached(
            f"the workspace already has {in_workspace} running agents started by runs"
            f" (limit {limit})",
            scope="workspace", limit=limit, running=in_workspace,
        )
    return None


@contextlib.contextmanager
def _launch_lock(settings: Settings) -> Iterator[None]:
    """One run-started launch at a time per data dir (one host per data dir):
    from its limit check until its pidfile names it."""
    path = data_path(settings, "agents", "launch.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class AgentLaunchStep:
    name = "agent_launch"

    def _pidfile(self, ctx: StepContext) -> Path:
        return data_path(ctx.settings, "agents", f"{ctx.task_id}.pid")

    def _run_id(self, ctx: StepContext) -> str:
        return str(session_id_for(ctx.task_id))

    def _cwd(self, ctx: StepContext) -> Path:
        """The first repository's worktree, wherever its owner made it (another
        node's data dir after a takeover), else a session folder."""
        repositories = ctx.manifest.get("repositories") or []
        paths = ctx.manifest.get("repository_paths", {})
        if repositories and repositories[0] in paths:
            found = RepositoryStep(repositories[0], paths[repositories[0]]).reconcile(ctx)
            if found is not None:
                return Path(found["worktree"])
        if repositories:
            return data_path(ctx.settings, "worktrees", str(ctx.task_id), repositories[0])
        return data_path(ctx.settings, "sessions", str(ctx.task_id))

    def _origin(self, ctx: StepContext) -> dict[str, Any]:
        """Where the launch comes from, kept in its pidfile for the agent census
        (agent/census.py): its workspace and, for a run's agent, that run."""
        origin = {"workspace_id": ctx.manifest["workspace_id"]}
        if ctx.manifest.get("started_by_run") is not None:
            origin["started_by_run"] = ctx.manifest["started_by_run"]
        return origin

    def run(self, ctx: StepContext) -> dict[str, Any]:
        existing = self.reconcile(ctx)
        if existing is not None:
            return existing
        if ctx.manifest.get("started_by_run") is None:
            return self._launch(ctx)
        with _launch_lock(ctx.settings):
            refusal = agent_limit_refusal(
                ctx.settings, ctx.manifest["workspace_id"], ctx.manifest["started_by_run"]
            )
            if refusal is not None:
                raise StepFailed(refusal)
            return self._launch(ctx)

    def _launch(self, ctx: StepContext) -> dict[str, Any]:
        run_id = self._run_id(ctx)
        ctx.fence()  # held still? an owner that lost its lease starts no agent
        try:
            secret = ctx.credentials.issue_run(ctx.workspace_id, run_id, ctx.task_id)
        except RunCredentialRevoked:
            raise StepFailed(AgentLaunchFailed("the run has already ended")) from None
        cwd = self._cwd(ctx)
        cwd.mkdir(parents=True, exist_ok=True)
        log_path = data_path(ctx.settings, "agents", f"{ctx.task_id}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = agent_environment(ctx.settings)
        env.update(
            KANDEV_RUN_ID=run_id,
            KANDEV_RUN_TOKEN=secret,
            KANDEV_TASK_ID=str(ctx.task_id),
            KANDEV_API_URL=ctx.settings.agent_api_url or ctx.settings.public_url,
            KANDEV_WORKTREE=str(cwd),
        )
        # The launch's span: the agent's own work (agentctl) joins the trace.
        parent = tracing.traceparent()
        if parent is not None:
            env["TRACEPARENT"] = parent
        command = shlex.split(ctx.settings.agent_command)
        try:
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            ctx.credentials.revoke_run(run_id, "launch_failed")
            failed = AgentLaunchFailed("the agent command failed to start")
            raise StepFailed(failed, detail=str(error)) from None
        # Its evidence names a process that /proc shows as the run's (so the
        # census counts it and a compensation finds it) once its exec is done.
        await_exec(process.pid, run_id)
        # Reap it when it exits, so a finished agent never lingers as a zombie,
        # and end its run credential with it.
        reaper_args = (process, ctx.app, ctx.credentials, run_id)
        threading.Thread(target=_reap, args=reaper_args, daemon=True).start()
        evidence = {
            "pid": process.pid,
            "run_id": run_id,
            "log": str(log_path),
            "cwd": str(cwd),
            "command": command,
            **self._origin(ctx),
        }
        self._pidfile(ctx).write_text(json.dumps(evidence), encoding="utf-8")
        return evidence

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        pidfile = self._pidfile(ctx)
        if pidfile.exists():
            evidence: dict[str, Any] = json.loads(pidfile.read_text(encoding="utf-8"))
            return evidence
        pids = processes_for_run(self._run_id(ctx))
        if not pids:
            return None
        # Launched, then the owner died before writing the pidfile: adopt it.
        evidence = {
            "pid": pids[0], "run_id": self._run_id(ctx), "adopted": True, **self._origin(ctx)
        }
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(json.dumps(evidence), encoding="utf-8")
        return evidence

    def compensate(self, ctx: StepContext) -> None:
        stop_run(self._run_id(ctx))
        ctx.credentials.revoke_run(self._run_id(ctx), "creation_aborted")
        self._pidfile(ctx).unlink(missing_ok=True)

    def absent(self, ctx: StepContext) -> bool:
        return not processes_for_run(self._run_id(ctx)) and not self._pidfile(ctx).exists()
