"""Every command of the README's tour, of docs/getting-started.md, of the home
page's quickstart (docs/index.md) and of docs/sync-a-backlog.md is run, in
order, against a real `kandev-es serve` started as "Run it" starts it (the
embedded default, the data dir ./.kandev-es of the directory the commands run
in). As a newcomer does: first the `curl` line the server printed, then every
command in "another terminal" — a fresh shell that has only what the tour's setup
block gives it (it activates ./.venv, here the venv running the tests, and exports
BASE, TOKEN and WS, set to what the server printed); no KANDEV_* variable, no venv
on PATH. Each command's output is compared line by line with the
output block shown after it: `…` stands for anything, and ids, times, tokens,
audit links and the port for their kind. An auditor's-page link a command prints
must open (KANDEV_PUBLIC_URL unset, while the server runs on a port of its own). So
the pages cannot rot.

Blocks the test does not run are marked just before the fence:
``<!-- run-command -->`` / ``<!-- test-command -->`` (CI runs those),
``<!-- not run: why -->``, and ``<!-- tour-setup -->`` (which must export exactly
BASE, TOKEN and WS). The embedded backend only: it is the one a newcomer runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
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


def run_shown(
    found: list[Block], index: int, env: dict[str, str], cwd: Path, where: str, setup: str
) -> str:
    """Run the page's block ``found[index]`` (sh or python) as written and compare
    what it prints with the ``text`` block right after it; its stdout. A shell
    block runs after ``setup`` (the tour's setup block with the server's values)."""
    block = found[index]
    command = ["bash", "-e", "-o", "pipefail", "-c", f"{setup}\n{block.text}"]
    if block.language == "python":
        command = [sys.executable, "-c", block.text]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stderr}"
    shown = found[index + 1] if index + 1 < len(found) else None
    assert shown is not None and shown.language == "text", f"{where}: no output block"
    assert_output(done.stdout, shown.text, where)
    return done.stdout


def fresh_shell() -> dict[str, str]:
    """What a new terminal has: no KANDEV_* variable, no virtual environment."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("KANDEV_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", "").split(os.pathsep)
        if not (Path(part) / "activate").is_file()
    )
    return env


def tour_setup(found: list[Block], page: Path, server: ServedProcess) -> str:
    """The page's setup block as a newcomer fills it in: its exports given the
    values the server printed, every other line as written."""
    setups = [block for block in found if block.marker == SETUP]
    assert len(setups) == 1, f"{page.name}: one {SETUP} block"
    assigned = re.findall(r"^export (\w+)=", setups[0].text, flags=re.M)
    assert sorted(assigned) == ["BASE", "TOKEN", "WS"], assigned
    values = {"BASE": server.base, "TOKEN": server.token or "", "WS": server.workspace_id}
    return re.sub(
        r"^export (\w+)=.*$",
        lambda line: f"export {line[1]}={shlex.quote(values[line[1]])}",
        setups[0].text,
        flags=re.M,
    )


def run_printed_curl_line(server: ServedProcess, env: dict[str, str], cwd: Path) -> None:
    """The curl line `serve` printed, run first as a newcomer does: it creates
    nothing, so the tour's first create still answers `created`."""
    [line] = re.findall(r"^\s*(curl .*)$", server.output(), flags=re.M)
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"has_more": False, "items": [], "next_cursor": None}


def run_page(page: Path, server: ServedProcess, cwd: Path) -> int:
    """The tour in a fresh shell after the printed curl line. The server listens
    on a port of its own, not "Run it"'s 8000 (KANDEV_PUBLIC_URL's default), and
    the shell has no KANDEV_PUBLIC_URL: the links `identity history` prints must
    name the server's real port all the same."""
    env = fresh_shell()
    # "another terminal" activates ./.venv: here, the environment running the tests
    # (CI runs the README's test command in no venv: one over its packages then)
    if sys.prefix != sys.base_prefix:
        (cwd / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        str(cwd / ".venv")], check=True, timeout=120)
    run_printed_curl_line(server, env, cwd)
    found = blocks(page)
    setup = tour_setup(found, page, server)
    # A python block is not run through the shell: it gets the setup's variables.
    python_env = {**env, "BASE": server.base, "TOKEN": server.token or "",
                  "WS": server.workspace_id}
    ran = 0
    for index, block in enumerate(found):
        if block.language not in ("sh", "python") or block.marker == SETUP:
            continue
        if block.marker.startswith(SKIPPED):
            continue
        where = f"{page.relative_to(ROOT)}:{block.line}"
        block_env = python_env if block.language == "python" else env
        stdout = run_shown(found, index, block_env, cwd, where, setup)
        ran += 1
        for link in AUDIT_LINK.findall(stdout):
            with urllib.request.urlopen(link, timeout=20) as answer:
                assert answer.status == 200 and "JIRA-1" in answer.read().decode()
    return ran


@pytest.mark.parametrize(
    ("page", "at_least"),
    [
        ("README.md", 5),
        ("docs/getting-started.md", 5),
        ("docs/index.md", 2),
        ("docs/sync-a-backlog.md", 8),
    ],
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
