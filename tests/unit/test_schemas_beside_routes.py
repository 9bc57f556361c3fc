"""One blueprint per resource, its marshmallow schemas beside it: a schema
defined in an api/ module is used by that module's routes and by no other
blueprint, so a resource's contract is read in one file. The schemas shared
across resources live below the API: views.py (the task and workspace
representations), creation/ (the create body and answer), errors.py's
ApiErrorSchema (every error body)."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "src" / "kandev_es" / "api"
SHARED = {"ApiErrorSchema"}


def schemas_defined(tree: ast.Module) -> set[str]:
    return {
        node.name for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Schema")
    }


def names_used(tree: ast.Module) -> set[str]:
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return used | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_each_api_schema_is_used_by_its_own_blueprint_only() -> None:
    trees = {path.stem: ast.parse(path.read_text(encoding="utf-8")) for path in API.glob("*.py")}
    assert "schemas" not in trees, "api/schemas.py: put each schema beside its blueprint"
    found = []
    for module, tree in trees.items():
        for schema in schemas_defined(tree) - SHARED:
            if schema not in names_used(tree):
                found.append(f"api/{module}.py defines {schema} but no route of it uses it")
            found.extend(
                f"api/{other}.py uses {schema} of api/{module}.py"
                for other, other_tree in trees.items()
                if other != module and schema in names_used(other_tree)
            )
    assert found == [], "\n".join(found)
