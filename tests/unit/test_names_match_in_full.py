"""Every name check matches the whole string: a valid name followed by a
newline is refused (a ``$`` anchor would match before the trailing newline)."""

from __future__ import annotations

import pytest

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.release import validate_operation_id
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import MissingOperationId
from kandev_es.storage.tables import TableSet


@pytest.mark.parametrize("tail", ["\n", "\r\n", " ", "\x00"])
def test_a_repository_name_with_anything_after_it_is_refused(tail):
    workspace = Workspace.open("acme")
    workspace.register_repository("inbox", "/srv/inbox")
    with pytest.raises(DomainRuleBroken):
        workspace.register_repository("inbox2" + tail, "/srv/inbox")
    assert list(workspace.repositories) == ["inbox"]


def test_a_workspace_name_or_prefix_with_a_trailing_newline_is_refused():
    with pytest.raises(DomainRuleBroken):
        Workspace.open("acme\n")
    with pytest.raises(DomainRuleBroken):
        Workspace.open("acme", task_prefix="KAN\n")


def test_a_release_operation_id_with_a_trailing_newline_is_refused():
    assert validate_operation_id("ticket-4711") == "ticket-4711"
    with pytest.raises(MissingOperationId):
        validate_operation_id("ticket-4711\n")


def test_a_table_suffix_with_a_trailing_newline_is_refused():
    assert TableSet("_next").suffix == "_next"
    with pytest.raises(ValueError):
        TableSet("_next\n")
