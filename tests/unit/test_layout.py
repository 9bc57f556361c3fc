"""The layout docs/architecture.md's Layout section describes: http/ holds the
contract, never a Python package that would shadow the standard library's ``http``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stdlib_http_still_imports_from_the_repository_root():
    result = subprocess.run(
        [sys.executable, "-c", "import http.client, flask; print(http.client.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not result.stdout.strip().startswith(str(ROOT / "http"))
    assert not (ROOT / "http" / "__init__.py").exists()


def test_projections_are_packaged_as_kandev_es_projections():
    import kandev_es.projections as projections

    assert Path(projections.__file__).resolve().parent == ROOT / "projections"
