"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build
--strict`` — a broken link or anchor, a page missing from the nav or a nav entry
without a page fails —, its API page lists every route of http/openapi.json, its
command reference has a heading for every click command, no page loads anything
from another host, and its configuration table has one row for every setting the
code reads, no more."""

from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT, built)
    assert done.returncode == 0, done.stderr
    return built


def test_the_site_builds_strict_and_lists_every_openapi_route(site):
    api_page = (site / "api" / "index.html").read_text(encoding="utf-8")
    spec = json.loads((ROOT / "http" / "openapi.json").read_text(encoding="utf-8"))
    for path in spec["paths"]:
        assert f"<code>{path}</code>" in api_page, path
    published = json.loads((site / "openapi.json").read_text(encoding="utf-8"))
    assert published == spec


def test_the_api_reference_shows_every_operation_with_its_schemas(site):
    page = (site / "api-reference" / "index.html").read_text(encoding="utf-8")
    spec = json.loads((ROOT / "http" / "openapi.json").read_text(encoding="utf-8"))
    headings = {
        re.sub(r"<[^>]+>|&para;", "", heading).strip()
        for heading in re.findall(r"<h3[^>]*>(.*?)</h3>", page)
    }
    for path, item in spec["paths"].items():
        for method in item.keys() & {"get", "post", "put", "patch", "delete"}:
            assert f"{method.upper()} {path}" in headings, f"{method.upper()} {path}"
    assert "CreateTaskRequest" in page and "ApiError" in page


def test_the_api_reference_opens_with_tasks_and_shows_the_schemas_own_examples(site):
    """Tasks first, not the agent side (the file lists paths alphabetically,
    agentctl first); every example built from the schemas' own, so none carries
    the renderer's warning about examples it makes up (every one did)."""
    page = (site / "api-reference" / "index.html").read_text(encoding="utf-8")
    groups = re.findall(r'<h2 id="([^"]+)"', page)
    assert groups[0] == "tasks" and groups.index("tasks") < groups.index("agentctl"), groups
    first = re.search(r'<h3 id="([^"]+)"', page)
    assert first is not None and first.group(1) == "post-apiv1tasks"
    assert "generated automatically" not in page and "not accurate" not in page
    create = page[page.index('id="post-apiv1tasks"') :]
    create = create[: create.index("<h3", 10)]
    request = re.sub(r"<[^>]+>", "", create[create.index("Request body") :])
    request = html.unescape(request)
    example = json.loads(request[request.index("{") : request.index("}") + 1])
    assert example == {
        "workspace_id": "7fc25427-7f8a-5abf-9d5e-8f212c56c7f1",
        "external_id": "JIRA-1",
        "title": "First task",
    }


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found.extend(command_paths(command, (*prefix, name)))
    return found


def test_the_command_reference_has_a_heading_for_every_command(site):
    from kandev_es.cli import main

    page = (site / "cli" / "index.html").read_text(encoding="utf-8")
    headings = set(re.findall(r'<h[1-6] id="([^"]+)"', page))
    paths = command_paths(main)
    assert len(paths) > 10
    missing = [" ".join(path) for path in paths if "-".join(("kandev-es", *path)) not in headings]
    assert missing == [], f"commands without a heading on the CLI page: {missing}"


class Loads(HTMLParser):
    """Every URL a page makes the browser fetch by itself (not the links one clicks)."""

    FETCHED = {"script": "src", "img": "src", "iframe": "src", "source": "src",
               "audio": "src", "video": "src", "image": "href", "use": "href"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "link":
            self.urls.append(values.get("href") or "")
        elif tag in self.FETCHED:
            self.urls.append(values.get(self.FETCHED[tag]) or values.get("xlink:href") or "")
        style = values.get("style") or ""
        self.urls.extend(re.findall(r"url\(([^)]*)\)", style))


def external(url: str) -> bool:
    url = url.strip().strip("'\"")
    return bool(re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", url, flags=re.I))


def test_no_page_or_stylesheet_loads_anything_from_another_host(site):
    offending = []
    for page in site.rglob("*.html"):
        parser = Loads()
        parser.feed(page.read_text(encoding="utf-8"))
        offending += [f"{page.relative_to(site)}: {url}" for url in parser.urls if external(url)]
    for sheet in site.rglob("*.css"):
        text = sheet.read_text(encoding="utf-8")
        for url in re.findall(r"@import\s+[\"']([^\"']+)|url\(([^)]*)\)", text):
            if any(external(part) for part in url):
                offending.append(f"{sheet.relative_to(site)}: {url}")
    assert offending == []


def test_a_page_loading_a_font_from_another_host_is_reported():
    parser = Loads()
    parser.feed('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
                '<a href="https://example.org/">a link is not a load</a>')
    assert [url for url in parser.urls if external(url)] == [
        "https://fonts.googleapis.com/css?family=Roboto"]


def warnings(stderr: str) -> list[str]:
    """mkdocs' WARNING records in ``stderr``, each with its continuation lines."""
    records: list[str] = []
    for line in stderr.splitlines():
        if re.match(r"[A-Z]+ +- ", line):
            records.append(line)
        elif records:
            records[-1] += "\n" + line
    return [record for record in records if record.startswith("WARNING")]


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    """A link to no page, an anchor no page has and a page out of the nav, in
    one build (strict mode reports every warning, then fails): each is a
    WARNING of its own, so each alone fails the build."""
    copy = tmp_path / "repo"
    for name in ("docs", "http", "scripts"):
        shutil.copytree(ROOT / name, copy / name)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "operations.md"
    broken = ("[gone](no-such-page.md)", "[gone](api.md#no-such-anchor)")
    page.write_text(page.read_text(encoding="utf-8") + "".join(f"\n{b}\n" for b in broken),
                    encoding="utf-8")
    (copy / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0, done.stderr
    warned = warnings(done.stderr)
    for needle in ("'no-such-page.md'", "'#no-such-anchor'", "- orphan.md"):
        assert sum(needle in record for record in warned) == 1, (needle, done.stderr)
    assert "Aborted with 3 warnings in strict mode" in done.stdout + done.stderr


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
