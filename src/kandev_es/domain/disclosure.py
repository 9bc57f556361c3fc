"""What a reader may see of a creation's record: the one rule every
representation of steps and identity events applies (the creator's
``/api/v1/creations/<handle>``, the identity history as JSON and as CLI lines,
the auditor's page).

The stored events stay complete, so auditors can always replay them. Operators
of the workspace and admins see them whole (``full``), because that is what
they diagnose with: the agent command, its log and working directory, the pid,
the worktree path, the owning process. Everyone else (a member reading its own
creation, a browser holding an audit link) sees a redacted view: the step, its
status and the facts that are no server configuration. It is built by
allowlist, so a key a step adds later stays hidden until it is listed here.
"""

from __future__ import annotations

from typing import Any

FAILED = "failed"

# Per step kind (the step name before ":"), the evidence keys anyone may read.
_SHOWN_EVIDENCE: dict[str, frozenset[str]] = {
    "agent_launch": frozenset({"run_id", "adopted", "started_by_run"}),
    "agent_session": frozenset({"session_id", "run_id", "profile"}),
    "repository": frozenset({"repository", "branch", "head"}),
    "attachment": frozenset({"sha256", "claimed_by"}),
    "policy": frozenset({"ledger", "limit", "in_use"}),
}
# Any step: the proof marker of a reconcile or compensation.
_ALWAYS_SHOWN = frozenset({"proof"})
# The plan fields that name server paths (the registered repositories' paths).
_HIDDEN_PLAN = frozenset({"repository_paths"})
# Events whose owner_id names the owning process (host and pid).
_OWNED = frozenset({"Claimed", "RecoveryClaimed", "RecoveryRenewed", "AbortForced"})


def step_evidence(step: str, status: str, evidence: dict[str, Any], full: bool) -> dict[str, Any]:
    """A step's evidence as this reader may see it. A failed step keeps its
    error code (the message and details may quote paths or the command)."""
    if full:
        return evidence
    shown = _ALWAYS_SHOWN | _SHOWN_EVIDENCE.get(step.partition(":")[0], frozenset())
    if status == FAILED:
        shown |= {"error"}
    return {key: value for key, value in evidence.items() if key in shown}


def owner(owner_id: str) -> str:
    """Who owned a creation, without its host or pid: the creating request or
    the recovery runtime."""
    return "runtime" if owner_id.startswith("runtime:") else "request"


def steps_seen(steps: dict[str, dict[str, Any]], full: bool) -> list[dict[str, Any]]:
    """A tenure's steps (name, status, evidence) as this reader may see them."""
    return [
        {
            "name": name,
            "status": record["status"],
            "evidence": step_evidence(name, record["status"], record["evidence"], full),
        }
        for name, record in steps.items()
    ]


def history_entry(entry: dict[str, Any], full: bool) -> dict[str, Any]:
    """One identity event (services/history.py's plain dict) as this reader may
    see it."""
    if full:
        return entry
    kind = entry.get("event")
    shown = dict(entry)
    if kind == "StepRecorded" and isinstance(entry.get("evidence"), dict):
        shown["evidence"] = step_evidence(
            str(entry.get("step")), str(entry.get("status")), entry["evidence"], full
        )
    if kind == "Claimed" and isinstance(entry.get("plan"), dict):
        shown["plan"] = {k: v for k, v in entry["plan"].items() if k not in _HIDDEN_PLAN}
    if kind == "Parked" and isinstance(entry.get("reason"), str):
        # The failure's own words may quote paths or commands: its kind only.
        shown["reason"] = entry["reason"].partition(":")[0]
    if kind in _OWNED and isinstance(entry.get("owner_id"), str):
        shown["owner_id"] = owner(entry["owner_id"])
    return shown
