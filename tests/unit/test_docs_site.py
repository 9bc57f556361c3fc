"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build
--strict`` — a broken link or anchor, a page missing from the nav or a nav entry
without a page fails —, its API page lists every route of http/openapi.json, and
its configuration table has one row for every setting the code reads, no more."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strict_and_lists_every_openapi_route(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    api_page = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    spec = json.loads((ROOT / "http" / "openapi.json").read_text(encoding="utf-8"))
    for path in spec["paths"]:
        assert f"<code>{path}</code>" in api_page, path
    published = json.loads((tmp_path / "site" / "openapi.json").read_text(encoding="utf-8"))
    assert published == spec


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    for name in ("docs", "http", "scripts"):
        shutil.copytree(ROOT / name, copy / name)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "operations.md"
    original = page.read_text(encoding="utf-8")
    for broken in ("[gone](no-such-page.md)", "[gone](api.md#no-such-anchor)"):
        page.write_text(original + f"\n{broken}\n", encoding="utf-8")
        done = build(copy, tmp_path / "site")
        assert done.returncode != 0 and "no-such" in done.stderr, broken
    page.write_text(original, encoding="utf-8")
    (copy / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stderr


def settings_read() -> set[str]:
    """Every KANDEV_* name config.py and http/gunicorn.conf.py spell out as a string."""
    names = set()
    for source in (ROOT / "src" / "kandev_es" / "config.py", ROOT / "http" / "gunicorn.conf.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and re.fullmatch(r"KANDEV_[A-Z0-9_]+", node.value):
                names.add(node.value)
    return names


def documented(page: str) -> list[str]:
    """The names of the configuration page's table rows (first column), in order."""
    return re.findall(r"^\| `(KANDEV_[A-Z0-9_]+)` \|", page, flags=re.M)


def test_the_configuration_table_has_a_row_for_every_setting_and_no_other():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = documented(page)
    assert len(rows) == len(set(rows)), "a setting has two rows"
    read = settings_read()
    assert read - set(rows) == set(), "settings without a row in docs/configuration.md"
    assert set(rows) - read - {"KANDEV_TASK_ID", "KANDEV_WORKTREE", "KANDEV_DEMO_AGENT_SECONDS"} \
        == set(), "rows for names config.py and gunicorn.conf.py do not read"


def test_a_new_setting_without_a_row_is_reported():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    without = page.replace("| `KANDEV_LEASE_SECONDS` |", "| LEASE |")
    assert "KANDEV_LEASE_SECONDS" in settings_read() - set(documented(without))
