"""Server-state validation of a create (step 4, after the schema): workflow and
step, registered repositories, uploaded attachments, agent profile, parent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kandev_es.application import Tasks
from kandev_es.creation.placement import Placement, check_parent
from kandev_es.domain.attachment import Attachment, attachment_id_for
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import AttachmentClaimed, UnknownReference, ValidationFailed
from kandev_es.limits import check_repository_path


def validate_against_workspace(
    app: Tasks,
    workspace: Workspace,
    fields: dict[str, Any],
    repository_roots: tuple[Path, ...],
    placed: Placement | None = None,
) -> None:
    """Check references and fill defaults in place; raise on the first unknown.
    ``placed``: the entry point's placement, whose parent is not loaded again."""
    workflow = fields["workflow"]
    steps = workspace.workflows.get(workflow)
    if steps is None:
        raise UnknownReference(f"unknown workflow {workflow!r}", field="workflow")
    if fields.get("workflow_step") is None:
        fields["workflow_step"] = steps[0]
    elif fields["workflow_step"] not in steps:
        raise UnknownReference(
            f"workflow {workflow!r} has no step {fields['workflow_step']!r}",
            field="workflow_step",
        )
    for name in fields["repositories"]:
        if name not in workspace.repositories:
            raise UnknownReference(f"unknown repository {name!r}", field="repositories")
    for name in ("repositories", "attachments"):
        if len(set(fields[name])) != len(fields[name]):
            raise ValidationFailed(f"{name} must not repeat an entry", field=name)
    fields["repository_paths"] = {
        name: workspace.repositories[name] for name in fields["repositories"]
    }
    for path in fields["repository_paths"].values():
        check_repository_path(Path(path), repository_roots)
    shas = []
    for reference in fields["attachments"]:
        sha = reference.removeprefix("sha256:")
        attachment = app.load(attachment_id_for(workspace.id, sha), Attachment)
        if attachment is None:
            raise UnknownReference(f"unknown attachment {reference!r}", field="attachments")
        if attachment.claimed_by is not None:
            raise AttachmentClaimed("attachment is claimed by another task", sha256=sha)
        shas.append(sha)
    fields["attachments"] = shas
    fields["wip_limit"] = workspace.wip_limit
    profile = fields.get("agent_profile")
    if profile is not None and profile not in workspace.agent_profiles:
        raise UnknownReference(f"unknown agent profile {profile!r}", field="agent_profile")
    parent_id = fields.get("parent_id")
    if parent_id is not None:
        check_parent(app, workspace, parent_id, placed)
