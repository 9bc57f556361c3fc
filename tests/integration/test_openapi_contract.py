"""The committed OpenAPI document (http/openapi.json) is the app's, byte for byte.

The spec is regenerated here exactly as scripts/export-openapi does it (that
script is not importable: scripts/ is no package), and the script's own
``--check`` mode is exercised too. On drift: run scripts/export-openapi.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kandev_es.api import create_app
from kandev_es.config import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = REPO_ROOT / "http" / "openapi.json"
EXPORT_SCRIPT = REPO_ROOT / "scripts" / "export-openapi"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("openapi")), run_projections=False)
    try:
        response = app.test_client().get("/api/openapi.json")
        assert response.status_code == 200
        spec: dict[str, Any] = response.get_json()
    finally:
        app.extensions["kandev_es"].close()
    return spec


def _render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"


def test_committed_spec_matches_the_app(generated: dict[str, Any]) -> None:
    assert SPEC_FILE.exists(), "http/openapi.json is missing: run scripts/export-openapi"
    committed = SPEC_FILE.read_text(encoding="utf-8")
    fresh = _render(generated)
    if committed != fresh:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    fresh.splitlines(keepends=True),
                    "http/openapi.json (committed)",
                    "generated from the app",
                )
            )[:80]
        )
        pytest.fail(f"http/openapi.json drifted; run scripts/export-openapi\n{diff}")


def test_export_script_check_mode_agrees() -> None:
    result = subprocess.run(
        [sys.executable, str(EXPORT_SCRIPT), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_export_script_check_mode_detects_drift(tmp_path: Path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text('{"openapi": "stale"}\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(EXPORT_SCRIPT), "--check", "--output", str(stale)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "out of date" in result.stderr


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return _resolve(spec, node)


def test_spec_has_the_create_and_lookup_routes(generated: dict[str, Any]) -> None:
    paths = generated["paths"]
    assert "post" in paths["/api/v1/tasks"]
    lookup = paths["/api/v1/workspaces/{workspace_id}/tasks/by-external-id"]
    assert "get" in lookup
    parameters = {p["name"]: p for p in lookup["get"].get("parameters", [])}
    assert parameters["external_id"]["in"] == "query"


def test_create_response_carries_the_outcome_tuple(generated: dict[str, Any]) -> None:
    ok = generated["paths"]["/api/v1/tasks"]["post"]["responses"]["200"]
    schema = _resolve(generated, ok["content"]["application/json"]["schema"])
    properties = schema["properties"]
    for name in ("outcome", "deduplicated", "creation_complete"):
        assert name in properties, f"create response lacks {name}"
        assert name in schema.get("required", []), f"{name} is not required"
    assert set(properties["outcome"]["enum"]) == {
        "created",
        "found_settled",
        "found_unsettled",
        "created_identity_lost",
    }
    assert properties["deduplicated"]["type"] == "boolean"
    assert properties["creation_complete"]["type"] == "boolean"


def test_lookup_response_carries_creation_complete(generated: dict[str, Any]) -> None:
    get = generated["paths"]["/api/v1/workspaces/{workspace_id}/tasks/by-external-id"]["get"]
    schema = _resolve(generated, get["responses"]["200"]["content"]["application/json"]["schema"])
    assert "creation_complete" in schema["properties"]
