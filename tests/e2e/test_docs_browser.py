"""The documentation site as a reader meets it: built ``--strict``, served over
HTTP (python's http.server), opened in a real headless Chromium at 1,280 px. A
search for "release" lists pages, the API reference shows an operation's
request schema, the home page draws the identity lifecycle, the architecture and
operations pages fit the width, and no page fetches anything from another host.
The server's own /api/docs page renders every operation from the service's
files, and a setting turns it off. Screenshots are kept in the test's tmp dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kandev_es.api import create_app
from kandev_es.config import Settings
from tests.support.chromium import Devtools, find_chromium
from tests.support.served import ServedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)  # find_chromium may apt-get install chromium first


def wait_until_served(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            assert process.poll() is None, "the site's web server exited"
            assert time.monotonic() < deadline, f"{url} not served within 30 s"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[str]:
    built = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(built)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_until_served(base, server)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Devtools]:
    devtools = Devtools(find_chromium(), tmp_path_factory.mktemp("chromium"))
    try:
        yield devtools
    finally:
        devtools.close()


def from_elsewhere(browser: Devtools, base: str) -> list[str]:
    """What the pages opened so far fetched from anywhere but ``base``."""
    return [url for url in browser.requested if not url.startswith((base, "data:", "about:"))]


def search_for_release_lists_pages(site: str, browser: Devtools, shots: Path) -> None:
    browser.open(site)
    browser.click(".md-search__input")
    browser.type("release")
    found = browser.wait_for("document.querySelectorAll('.md-search-result__item').length")
    assert found >= 3
    meta = browser.evaluate("document.querySelector('.md-search-result__meta').textContent")
    assert meta.endswith("matching documents"), meta
    titles = browser.evaluate(
        "[...document.querySelectorAll('.md-search-result__item h1')].map(h => h.textContent)")
    assert "Command line" in titles and "API reference" in titles, titles
    browser.screenshot(shots / "search-release.png")
    assert from_elsewhere(browser, site) == []


def api_reference_shows_an_operations_request_schema(
    site: str, browser: Devtools, shots: Path
) -> None:
    browser.open(site + "api-reference/#post-apiv1tasks")
    # The create's section: its heading, then the request body's example and schema.
    section = browser.wait_for("""(() => {
        const heading = document.getElementById('post-apiv1tasks');
        const parts = [];
        for (let e = heading.nextElementSibling; e && e.tagName !== 'H3'; e = e.nextElementSibling)
            parts.push(e);
        const example = parts.find(e => e.textContent.includes('"external_id"'));
        const r = example.getBoundingClientRect();
        return {heading: heading.textContent, text: example.textContent,
                all: parts.map(e => e.textContent).join(' '),
                width: r.width, height: r.height, top: r.top,
                first: document.querySelector('.md-content h3').id};
    })()""")
    assert section["heading"].startswith("POST /api/v1/tasks")
    assert section["first"] == "post-apiv1tasks", "the reference opens with the create"
    # the example is the schemas' own (a create as the tours send it), the schema all of it
    for value in ('"external_id": "JIRA-1"', '"title": "First task"'):
        assert value in section["text"], value
    assert '"start_agent"' in section["all"] and "not accurate" not in section["all"]
    assert section["width"] > 300 and section["height"] > 60, section
    browser.screenshot(shots / "api-reference.png")
    assert from_elsewhere(browser, site) == []


def home_page_draws_the_identity_lifecycle(site: str, browser: Devtools, shots: Path) -> None:
    browser.open(site)
    drawing = browser.wait_for("""(() => {
        const svg = document.querySelector('#lifecycle svg');
        svg.scrollIntoView();
        const r = svg.getBoundingClientRect();
        const words = [...svg.querySelectorAll('text')].map(t => t.textContent).join(' ');
        const box = svg.querySelector('text').getBBox();
        return {width: r.width, height: r.height, words, glyph_width: box.width};
    })()""")
    assert drawing["width"] >= 600 and drawing["height"] >= 200, drawing
    assert drawing["glyph_width"] > 0, "the drawing's text has no width: not rendered"
    for step in ("claim", "complete", "release", "aborted", "found_unsettled"):
        assert step in drawing["words"], step
    browser.screenshot(shots / "lifecycle.png")
    assert from_elsewhere(browser, site) == []


def page_reads_whole_at_1280_px(site: str, browser: Devtools, page: str) -> None:
    browser.open(site + page)
    overflowing = browser.evaluate("""
        [...document.querySelectorAll('.md-content pre, .md-content table')]
        .filter(e => e.scrollWidth > e.clientWidth + 1)
        .map(e => e.textContent.slice(0, 60))""")
    assert overflowing == [], f"cut off at 1,280 px on {page}: {overflowing}"
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1280


def test_a_reader_searches_reads_the_reference_and_sees_the_lifecycle_offline(
    site, browser, tmp_path
):
    """One test, so that one worker builds and serves the site once."""
    search_for_release_lists_pages(site, browser, tmp_path)
    api_reference_shows_an_operations_request_schema(site, browser, tmp_path)
    home_page_draws_the_identity_lifecycle(site, browser, tmp_path)
    for page in ("architecture/", "operations/", "getting-started/"):
        page_reads_whole_at_1280_px(site, browser, page)


def test_the_served_api_docs_page_renders_every_operation_from_local_files(
    browser, tmp_path
):
    server = ServedProcess(Settings(data_dir=tmp_path / "data"), tmp_path)
    try:
        browser.requested.clear()
        browser.open(f"{server.base}/api/docs")
        operations = browser.wait_for("document.querySelectorAll('.opblock').length")
        assert operations >= 20
        paths = browser.evaluate(
            "[...document.querySelectorAll('.opblock-summary-path')].map(e => e.textContent)")
        assert "/api/v1/tasks" in " ".join(paths)
        browser.screenshot(tmp_path / "api-docs.png")
        assert from_elsewhere(browser, server.base) == []
    finally:
        server.stop()


def test_the_api_docs_page_can_be_turned_off(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, api_docs=False), run_projections=False)
    try:
        client = app.test_client()
        assert client.get("/api/docs").status_code == 404
        assert client.get("/api/docs/assets/swagger-ui-bundle.js").status_code == 404
        assert client.get("/api/openapi.json").status_code == 200
    finally:
        app.extensions["kandev_es"].close()
