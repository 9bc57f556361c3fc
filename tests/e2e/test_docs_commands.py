"""Every command of the README's tour, of docs/getting-started.md and of the home
page's quickstart (docs/index.md) is run, in
order, against a real `kandev-es serve` started as "Run it" starts it (the
embedded default, the data dir ./.kandev-es of the directory the commands run
in), with the variables the tour's setup block defines (BASE, TOKEN, WS) set from
what the server printed. Each command's output is compared line by line with the
output block shown after it: `…` stands for anything, and ids, times, tokens,
audit links and the port for their kind. An auditor's-page link a command prints
must open. So the pages cannot rot.

Blocks the test does not run are marked just before the fence:
``<!-- run-command -->`` / ``<!-- test-command -->`` (CI runs those),
``<!-- not run: why -->``, and ``<!-- tour-setup -->`` (which must export exactly
BASE, TOKEN and WS). The embedded backend only: it is the one a newcomer runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.support.pages import Block, blocks
from tests.support.served import ServedProcess

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = ("<!-- run-command -->", "<!-- test-command -->", "<!-- not run:")
SETUP = "<!-- tour-setup -->"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00"
VARYING = {
    UUID: UUID,
    TIME: TIME,
    r"kes_[A-Za-z0-9_-]+": r"kes_[A-Za-z0-9_-]+",
    r"kal_[A-Za-z0-9_-]+": r"kal_[A-Za-z0-9_-]+",
    r"http://127\.0\.0\.1:8000": r"http://127\.0\.0\.1:\d+",
    "…": ".*",
}
AUDIT_LINK = re.compile(r"http://127\.0\.0\.1:\d+/audit/identities\?\S+")


def pattern(expected: str) -> re.Pattern[str]:
    """An expected output line as a regex: literal text, `…` anything, varying values."""
    alternatives = "|".join(f"(?P<v{n}>{key})" for n, key in enumerate(VARYING))
    regex, position = "", 0
    for match in re.finditer(alternatives, expected):
        regex += re.escape(expected[position : match.start()])
        chosen = next(n for n in range(len(VARYING)) if match.group(f"v{n}") is not None)
        regex += list(VARYING.values())[chosen]
        position = match.end()
    return re.compile(regex + re.escape(expected[position:]))


def assert_output(actual: str, expected: str, where: str) -> None:
    got, want = actual.rstrip().splitlines(), expected.rstrip().splitlines()
    assert len(got) == len(want), f"{where}: {len(got)} lines, shown {len(want)}:\n{actual}"
    for number, (line, shown) in enumerate(zip(got, want, strict=True), 1):
        assert pattern(shown.rstrip()).fullmatch(line.rstrip()), (
            f"{where}, output line {number}:\n  got   {line}\n  shown {shown}"
        )


def run_shown(found: list[Block], index: int, env: dict[str, str], cwd: Path, where: str) -> str:
    """Run the page's block ``found[index]`` (sh or python) as written and compare
    what it prints with the ``text`` block right after it; its stdout."""
    block = found[index]
    command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    if block.language == "python":
        command = [sys.executable, "-c", block.text]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stderr}"
    shown = found[index + 1] if index + 1 < len(found) else None
    assert shown is not None and shown.language == "text", f"{where}: no output block"
    assert_output(done.stdout, shown.text, where)
    return done.stdout


def run_page(page: Path, server: ServedProcess, cwd: Path) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # "Run it" serves on 127.0.0.1:8000, which is KANDEV_PUBLIC_URL's default: the
    # test's server has another port, so the links it prints name that one.
    env.update(BASE=server.base, TOKEN=server.token or "", WS=server.workspace_id,
               KANDEV_PUBLIC_URL=server.base)
    found = blocks(page)
    ran = 0
    setups = [block for block in found if block.marker == SETUP]
    assert len(setups) == 1, f"{page.name}: one {SETUP} block"
    assigned = re.findall(r"^export (\w+)=", setups[0].text, flags=re.M)
    assert sorted(assigned) == ["BASE", "TOKEN", "WS"], assigned
    for index, block in enumerate(found):
        if block.language not in ("sh", "python") or block.marker == SETUP:
            continue
        if block.marker.startswith(SKIPPED):
            continue
        where = f"{page.relative_to(ROOT)}:{block.line}"
        stdout = run_shown(found, index, env, cwd, where)
        ran += 1
        for link in AUDIT_LINK.findall(stdout):
            with urllib.request.urlopen(link, timeout=20) as answer:
                assert answer.status == 200 and "JIRA-1" in answer.read().decode()
    return ran


@pytest.mark.parametrize(
    ("page", "at_least"),
    [("README.md", 5), ("docs/getting-started.md", 5), ("docs/index.md", 2)],
)
def test_every_command_of_the_page_runs_and_prints_what_it_shows(page, at_least, tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    server = ServedProcess(Settings(data_dir=clone / ".kandev-es"), tmp_path)
    try:
        assert server.first_start
        ran = run_page(ROOT / page, server, clone)
        assert ran >= at_least, f"only {ran} commands found on {page}"
    finally:
        server.stop()


def test_a_command_whose_output_differs_from_the_page_fails():
    shown = '{…,"outcome":"created",…}'
    assert_output('{"id":"x","outcome":"created","title":"t"}', shown, "page")
    with pytest.raises(AssertionError):
        assert_output('{"id":"x","outcome":"found_settled","title":"t"}', shown, "page")
    with pytest.raises(AssertionError):
        assert_output("one\ntwo", "one", "page")
