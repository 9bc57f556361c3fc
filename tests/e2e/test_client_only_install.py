"""The client-only install: ``pip install ./clients/python`` into a fresh venv
without site packages brings httpx and the client, not the server (no flask,
gunicorn, mcp, eventsourcing, kandev_es) nor the verifier's cryptography/cffi,
and that client creates and retries a task against a real served process; its
``kandev-es-verify`` says to install the ``[verify]`` extra, and with the extra
it checks that task's identity proof bundle with the public key alone, the
server stopped (docs/auditing.md).
One version for the client, the server, the package metadata and the changelog."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import venv
from importlib.metadata import version
from pathlib import Path

import httpx

from kandev_es.config import Settings
from tests.support.served import ServedProcess

ROOT = Path(__file__).resolve().parents[2]

CLIENT_ONLY = """
import importlib.util, os, sys
from kandev_es_client import Client

for server_part in ("flask", "gunicorn", "mcp", "eventsourcing", "kandev_es", "click"):
    assert importlib.util.find_spec(server_part) is None, server_part + " is installed"
for verify_part in ("cryptography", "cffi"):  # the [verify] extra's, not the client's
    assert importlib.util.find_spec(verify_part) is None, verify_part + " is installed"
with Client(os.environ["BASE"], os.environ["TOKEN"], deadline=30) as client:
    first = client.create_task(os.environ["WS"], "From the client", external_id="CLIENT-1")
    again = client.create_task(os.environ["WS"], "From the client", external_id="CLIENT-1")
print(first.outcome, again.outcome, first.task["id"] == again.task["id"])
"""


def test_the_client_installs_alone_and_creates_against_a_served_process(tmp_path):
    env_dir = tmp_path / "client-venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    source = tmp_path / "client-src"  # pip builds in place: keep the clone clean
    shutil.copytree(ROOT / "clients" / "python", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    settings = Settings(data_dir=tmp_path / "data")
    server = ServedProcess(settings, tmp_path)
    try:
        done = subprocess.run(
            [str(python), "-c", CLIENT_ONLY],
            env={"BASE": server.base, "TOKEN": server.token or "", "WS": server.workspace_id,
                 "PATH": str(env_dir / "bin")},
            capture_output=True, text=True, timeout=120,
        )
        bundle = _covered_bundle(server)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["created", "found_settled", "True"]
    _verify_needs_the_extra(env_dir)
    with_extra = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{source}[verify]"],
        capture_output=True, text=True, timeout=600,
    )
    assert with_extra.returncode == 0, with_extra.stderr
    _verified_offline(env_dir, tmp_path, settings, bundle)


def _verify_needs_the_extra(env_dir: Path) -> None:
    """Without the extra, kandev-es-verify names it in one line (no traceback)."""
    verify = [str(env_dir / "bin" / "kandev-es-verify"), "bundle", "b.json", "--keyring", "k"]
    bare = subprocess.run(verify, capture_output=True, text=True, timeout=60, env={})
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert bare.stderr.strip() == (
        "kandev-es-verify needs the verify extra (cryptography): "
        "pip install 'kandev-es-client[verify]'"
    ), bare.stderr


def _covered_bundle(server: ServedProcess) -> dict:
    """CLIENT-1's proof bundle once a checkpoint covers all of its events (the
    served process's sequencer signs one every KANDEV_LEDGER_CHECKPOINT_SECONDS)."""
    deadline = time.monotonic() + 30
    while True:
        answer = httpx.get(
            f"{server.base}/api/v1/workspaces/{server.workspace_id}/identities/history",
            params={"external_id": "CLIENT-1", "proof": "1"},
            headers={"Authorization": f"Bearer {server.token}"}, timeout=10,
        )
        bundle = answer.json().get("proof") if answer.status_code == 200 else None
        size = int(bundle["checkpoint"].split("\n")[1]) if bundle else 0
        if bundle and all((e["leaf_index"] or size) < size for e in bundle["events"]):
            return bundle
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.2)


def _verified_offline(env_dir: Path, tmp_path: Path, settings: Settings, bundle: dict) -> None:
    """The client-only venv's kandev-es-verify checks the bundle with the public
    key alone, the server stopped; a changed event fails, named by its version."""
    from kandev_es.services.ledger import keyring_of, load_signer

    (tmp_path / "keyring.json").write_text(keyring_of(load_signer(settings)).to_json())
    verify = [str(env_dir / "bin" / "kandev-es-verify"), "bundle", str(tmp_path / "b.json"),
              "--keyring", str(tmp_path / "keyring.json")]
    (tmp_path / "b.json").write_text(json.dumps(bundle))
    ok = subprocess.run(verify, capture_output=True, text=True, timeout=60, env={})
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "OK", ok.stdout + ok.stderr
    bundle["events"][1]["state"] = base64.b64encode(b"{}").decode()
    (tmp_path / "b.json").write_text(json.dumps(bundle))
    bad = subprocess.run(verify, capture_output=True, text=True, timeout=60, env={})
    assert bad.returncode == 1 and "v2 " in bad.stdout and "failed" in bad.stdout, bad.stdout


def test_one_version_for_client_server_metadata_and_changelog():
    import kandev_es_client

    import kandev_es

    assert kandev_es_client.__version__ == kandev_es.__version__ == version("kandev-es")
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    newest = re.search(r"^## \[?(\d+\.\d+\.\d+)", changelog, flags=re.M)
    assert newest and newest.group(1) == kandev_es.__version__
    from kandev_es.client import Client

    assert Client is kandev_es_client.Client  # one copy of the code
