"""The auditor's page in a real headless Chromium against a real `kandev-es
serve`, both backends: what a person sees on the link that `kandev-es identity
history` prints — each tenure, its claim, the release with its operation id and
actor, the task each tenure produced (an in-page link to its identifier, title,
state and workflow step), the hostile external id and title shown as text — and
that an expired link, or a link used for another identity, is refused. The
link's secret never reaches the server's log. A history that fails its
tamper-evidence check opens with a red alert banner. docs/audit-page.png is this
test's screenshot of a plain identity (KANDEV_DOCS_SCREENSHOT=1 writes it there)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.external_id import identity_id
from tests.integration.tampering import TAMPERING
from tests.support.chromium import Chromium, Devtools, find_chromium, png_pixel, png_size
from tests.support.served import ServedProcess, http, run_cli

HOSTILE_ID = '<script>alert("id")</script>JIRA-9'
HOSTILE_TITLE = "<img src=x onerror=alert(1)><script>alert('title')</script>"
LINK_RE = re.compile(r"^\s+(http://\S+/audit/identities\?\S+)$", re.MULTILINE)
BAR_COLOUR = (0x1D, 0x23, 0x30)  # .bar in audit.css: the stylesheet applied
PLAIN_ID = "JIRA-4711"  # the identity of docs/audit-page.png
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "audit-page.png"


# find_chromium may apt-get install chromium on a first run (up to 900 s per command).
pytestmark = pytest.mark.timeout(2000)


@pytest.fixture
def chromium(tmp_path: Path) -> Chromium:
    return Chromium(find_chromium(), tmp_path)


@pytest.fixture
def server(settings: Any, tmp_path: Path):
    served = ServedProcess(settings, tmp_path)
    yield served
    served.stop()


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _history_link(settings: Any, server: ServedProcess, external_id: str, **env: str) -> str:
    done = run_cli(
        settings,
        "identity",
        "history",
        "--workspace",
        server.workspace_id,
        "--external-id",
        external_id,
        KANDEV_PUBLIC_URL=server.base,
        **env,
    )
    assert done.returncode == 0, done.stderr
    found = LINK_RE.search(done.stdout)
    assert found, done.stdout
    return found.group(1)


def _two_tenures(
    server: ServedProcess, external_id: str = HOSTILE_ID, title: str = HOSTILE_TITLE,
    operation: str = "ticket-4711-release",
) -> dict[str, Any]:
    """Tenure 1 (hostile title) released by an operator token, tenure 2 holding."""
    label = f"auditor test {external_id}"
    operator = http(
        "POST",
        server.base + "/api/v1/tokens",
        server.token,
        {"workspace_id": server.workspace_id, "role": "operator", "label": label},
    )
    assert operator.status == 201, operator.body
    # A WIP limit makes every create prove a step (policy:wip) with evidence.
    policy = http(
        "PUT",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/policy",
        server.token,
        {"wip_limit": 10},
    )
    assert policy.status == 200, policy.body
    body = {"workspace_id": server.workspace_id, "external_id": external_id}
    first = http("POST", server.base + "/api/v1/tasks", server.token, {**body, "title": title})
    assert first.body["outcome"] == "created", first.body
    query = urllib.parse.urlencode({"external_id": external_id})
    release = urllib.request.Request(
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id?{query}",
        method="DELETE",
        headers={
            "Authorization": f"Bearer {operator.body['token']}",
            "Idempotency-Key": operation,
        },
    )
    with urllib.request.urlopen(release, timeout=20) as answer:
        assert answer.status == 200
    second = http("POST", server.base + "/api/v1/tasks", server.token, {**body, "title": "Second"})
    assert second.body["outcome"] == "created", second.body
    other = {"workspace_id": server.workspace_id, "external_id": "OTHER-1", "title": "Other"}
    assert http("POST", server.base + "/api/v1/tasks", server.token, other).status == 200
    tokens = http("GET", server.base + "/api/v1/tokens", server.token).body["tokens"]
    (operator_id,) = [t["id"] for t in tokens if t["label"] == label]
    return {"first": first.body, "second": second.body, "operator_id": operator_id,
            "operator": operator.body["token"]}


def _text(dom: str) -> str:
    """Roughly what a person reads: the DOM's text without tags, whitespace folded."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def test_a_person_sees_each_tenure_release_actor_task_and_hostile_text_as_text(
    settings, server, chromium, tmp_path
):
    made = _two_tenures(server)
    link = _history_link(settings, server, HOSTILE_ID)
    dom = chromium.dump_dom(link)

    assert "<script" not in dom.lower(), "no script element: hostile input stayed text"
    assert "<img" not in dom.lower(), "no img element either"
    text = _text(dom)
    assert 'Identity &lt;script&gt;alert("id")&lt;/script&gt;JIRA-9' in text
    assert text.count("Tenure 1") == 1 and text.count("Tenure 2") == 1
    assert "held by tenure 2" in text and "tenures 2" in text
    assert "&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;alert('title')&lt;/script&gt;" in text
    tenure_1 = dom[dom.index('id="tenure-1"') : dom.index('id="tenure-2"')]
    assert "ticket-4711-release" in _text(tenure_1)
    assert f"by token:{made['operator_id']}" in _text(tenure_1), "release actor shown"
    assert f'href="#task-{made["first"]["id"]}"' in tenure_1, "the task it produced"
    assert made["first"]["identifier"] in _text(tenure_1)
    tenure_2 = dom[dom.index('id="tenure-2"') : dom.index('class="tasks"')]
    assert f'href="#task-{made["second"]["id"]}"' in tenure_2
    assert "/api/v1/" not in dom, "no link on the page needs a bearer token"
    assert "proof-download" not in dom, "a link's reader sees the redacted view: no bundle"
    assert "kandev-es identity history --proof" in _text(dom)
    for task in (made["first"], made["second"]):  # a release leaves its task be
        card = dom[dom.index(f'id="task-{task["id"]}"') :]
        card = _text(card[: card.index("</section>")])
        assert task["identifier"] in card and task["id"] in card, card
        assert "state active" in card and "workflow default step backlog" in card, card
    assert "title Second" in _text(dom[dom.index(f'id="task-{made["second"]["id"]}"') :])
    assert "holds the identity" in _text(tenure_2) and "Second" in _text(tenure_2)
    ledger = _text(dom[dom.index('class="ledger ') : dom.index("Tenures, oldest first")])
    assert "Tamper evidence" in ledger and "FAILED" not in ledger, ledger
    assert any(words in ledger for words in ("verified up to the checkpoint of size",
                                             "no signed checkpoint yet")), ledger
    assert "outcome created" in _text(tenure_1) and "outcome created" in _text(tenure_2)
    rows = tenure_1.split('<tr class="event ')[1:]
    steps = [_text(row) for row in rows if row.startswith("event-StepRecorded")]
    assert any("policy:wip" in row and "succeeded" in row and "evidence" in row for row in steps)

    # The documentation's screenshot: a plain identity's page (the hostile one
    # above would alarm a reader), its two tenures, the release and the tasks.
    _two_tenures(server, PLAIN_ID, "Fix the invoice export", "ticket-4712-release")
    plain = _history_link(settings, server, PLAIN_ID)
    plain_dom = chromium.dump_dom(plain)
    assert f"Identity {PLAIN_ID}" in _text(plain_dom) and "&lt;" not in plain_dom
    shot = chromium.screenshot(plain, tmp_path / "audit-page.png")
    assert png_size(shot) == (1280, 1500)
    assert png_pixel(shot, 5, 5) == BAR_COLOUR, "the page's own stylesheet loaded under its CSP"
    if os.environ.get("KANDEV_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)

    secret = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["audit_link"][0]
    log = server.stderr_path.read_text(errors="replace")
    assert "/audit/identities" in log, "the page requests were logged"
    assert secret not in log, "the link's secret never reaches the log"
    assert "audit_link=[redacted]" in log, "the access line is there, blanked"


def test_an_expired_link_and_a_link_for_another_identity_are_refused(settings, server, chromium):
    _two_tenures(server)
    link = _history_link(settings, server, HOSTILE_ID)
    parts = urllib.parse.urlsplit(link)
    query = dict(urllib.parse.parse_qsl(parts.query))

    other = {**query, "external_id": "OTHER-1"}
    for refused in (
        other,
        {**query, "workspace": "00000000-0000-0000-0000-000000000000"},
        {**query, "audit_link": "kal_" + "x" * 43},
        {k: v for k, v in query.items() if k != "audit_link"},
    ):
        url = parts._replace(query=urllib.parse.urlencode(refused)).geturl()
        dom = chromium.dump_dom(url)
        assert "404" in _text(dom) and "identity not found" in _text(dom), dom
        assert "Tenure" not in dom and "OTHER-1" not in dom and "JIRA-9" not in dom
        status, _ = _status(url)
        assert status == 404

    expired = _history_link(settings, server, HOSTILE_ID, KANDEV_AUDIT_LINK_SECONDS="0")
    dom = chromium.dump_dom(expired)
    assert "identity not found" in _text(dom) and "Tenure" not in dom
    assert _status(expired)[0] == 404

    # The link is no bearer token: the REST API does not know it.
    secret = query["audit_link"]
    api = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks"
    assert _status(api, {"Authorization": f"Bearer {secret}"})[0] == 404
    # And the valid link still works for its own identity.
    assert _status(link)[0] == 200


def _covered_by_a_checkpoint(
    server: ServedProcess, token: str, seconds: float = 30.0, external_id: str = HOSTILE_ID
) -> int:
    """Until the served sequencer signed a checkpoint covering every event of
    the identity (every 2 s by default): the number of its events."""
    query = urllib.parse.urlencode({"external_id": external_id, "proof": "1"})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/identities/history?{query}"
    deadline = time.monotonic() + seconds
    while True:
        answer = http("GET", url, token)
        if answer.status == 200:
            events = answer.body["proof"]["events"]
            if all(event["inclusion"] for event in events):  # more than one leaf: never []
                return len(events)
        assert time.monotonic() < deadline, f"no checkpoint covers the identity: {answer.body}"
        time.sleep(0.2)


def _downloaded(folder: Path, seconds: float = 30.0) -> Path:
    deadline = time.monotonic() + seconds
    while True:
        done = [f for f in folder.glob("*.json") if not f.name.endswith(".crdownload")]
        if done:
            return done[0]
        assert time.monotonic() < deadline, f"nothing downloaded: {list(folder.iterdir())}"
        time.sleep(0.1)


def test_an_operator_downloads_the_proof_bundle_the_offline_verifier_accepts(
    settings, server, tmp_path
):
    made = _two_tenures(server)
    events = _covered_by_a_checkpoint(server, made["operator"])
    keyring = tmp_path / "keyring.json"  # the public key only, as an auditor gets it
    printed = run_cli(settings, "audit", "keyring")
    assert printed.returncode == 0, printed.stderr
    keyring.write_text(printed.stdout)
    assert "PRIVATE" not in printed.stdout, "a signed-note private key never leaves the server"
    query = urllib.parse.urlencode({"workspace": server.workspace_id, "external_id": HOSTILE_ID})
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser = Devtools(find_chromium(), tmp_path)
    try:
        # The operator's browser sends its bearer token (as a signing-in proxy would).
        browser.call("Network.setExtraHTTPHeaders", session=browser.session,
                     headers={"Authorization": f"Bearer {made['operator']}"})
        browser.call("Browser.setDownloadBehavior", behavior="allow",
                     downloadPath=str(downloads))
        browser.open(f"{server.base}/audit/identities?{query}")
        ledger = browser.evaluate("document.querySelector('.ledger-state').textContent")
        assert f"all {events} events verified up to the checkpoint" in ledger, ledger
        browser.click("a.proof-download")
        bundle = _downloaded(downloads)
    finally:
        browser.close()
    assert bundle.name.startswith("proof-") and json.loads(bundle.read_text())["external_id"] \
        == HOSTILE_ID
    verifier = Path(sys.executable).parent / "kandev-es-verify"
    checked = subprocess.run([str(verifier), "bundle", str(bundle), "--keyring", str(keyring)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[-1] == "OK" and sum(": verified" in line for line in lines) == events, lines


ALERT = """(() => {
    const alert = document.querySelector('[role=alert]');
    if (!alert) return null;
    const verdict = alert.querySelector('.tamper-verdict');
    const box = alert.getBoundingClientRect(), seen = getComputedStyle(alert);
    const words = getComputedStyle(verdict);
    return {text: alert.textContent, top: box.top, width: box.width,
            background: seen.backgroundColor, colour: seen.color,
            size: parseFloat(words.fontSize), weight: parseInt(words.fontWeight),
            first: document.querySelector('main').firstElementChild === alert};
})()"""


def test_a_failed_check_is_a_red_alert_banner_first_on_the_page(settings, server, tmp_path):
    """An event of the identity changed in the database after it was logged:
    the page opens (under the bar, above everything) with a red role=alert
    banner whose verdict is larger and bolder than anything else on it; an
    intact identity's page has no alert at all."""
    made = _two_tenures(server, PLAIN_ID, "Fix the invoice export")
    _covered_by_a_checkpoint(server, made["operator"], external_id=PLAIN_ID)
    intact = _history_link(settings, server, "OTHER-1")
    services = bootstrap(settings.with_overrides(create_tables=False))
    try:
        TAMPERING["edit"](services, identity_id(uuid.UUID(server.workspace_id), PLAIN_ID))
    finally:
        services.close()
    browser = Devtools(find_chromium(), tmp_path)
    try:
        browser.open(intact)
        browser.wait_for("document.querySelector('.ledger-state') !== null")
        assert browser.evaluate(ALERT) is None, "an intact history raises no alert"
        browser.open(_history_link(settings, server, PLAIN_ID))
        alert = browser.wait_for(ALERT)
        browser.screenshot(tmp_path / "tampered.png")
    finally:
        browser.close()
    assert alert["text"].strip().startswith("FAILED"), alert
    assert alert["first"] and alert["top"] < 80 and alert["width"] > 1000, alert
    assert alert["background"] == "rgb(180, 35, 24)" and alert["colour"] == "rgb(255, 255, 255)"
    assert alert["size"] >= 24 and alert["weight"] >= 700, alert
