"""The create protocol is one implementation: only domain/creation.py builds a
claim's Task (``Task.create``) and claims an identity for it, only the creation
service calls that, and every entry point creates through
``CreationService.create`` (agentctl through api/office.py, the CLI's
``task create`` directly). A second path
written anywhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kandev_es"


def callers(attribute: str, owner: str | None = None) -> set[str]:
    """Modules (relative to kandev_es) with a call ``<owner>.<attribute>(...)``;
    any owner when ``owner`` is None (then the owner's last name is not checked)."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != attribute:
                continue
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if owner is None or name == owner:
                found.add(str(path.relative_to(SRC)))
    return found


def test_only_the_domain_builds_a_claimed_task():
    assert callers("create", owner="Task") == {"domain/creation.py"}


def test_only_the_creation_service_claims():
    assert callers("claim", owner="creation") == {"creation/service.py"}
    # The other ``claim`` is an attachment's, a step's effect.
    assert callers("claim") == {
        "domain/creation.py",
        "creation/service.py",
        "creation/steps/attachments.py",
    }


def test_every_entry_point_creates_through_the_one_service():
    assert callers("create", owner="creation") == {
        "api/tasks.py",
        "api/office.py",
        "mcp/handlers.py",
        "cli_tasks.py",
        "bulk/service.py",
    }
