"""The reverse proxy of docs/operations.md leaks nothing and answers like the
API: Debian's nginx, with Debian's own nginx.conf and the page's nginx block
(read from the page; only its ports, certificate and log paths moved to a
temporary directory), in front of a served instance. An auditor's link is sent
over both server blocks, then the upstream is stopped: no file nginx wrote holds
the link's secret, and the answer without an upstream is the API's own 503
(JSON error body, Retry-After, no-store), never nginx's HTML 502."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse
from http.client import HTTPConnection, HTTPSConnection
from pathlib import Path

import pytest

from kandev_es.api.errors import ApiErrorSchema
from kandev_es.config import Settings
from kandev_es.errors import Unavailable
from tests.support.pages import ROOT, only_block, replaced
from tests.support.served import ServedProcess, free_port, http, run_cli

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
DEBIAN_CONF = Path("/etc/nginx/nginx.conf")
HOST = "kandev.example.com"

pytestmark = pytest.mark.skipif(
    not (os.access(NGINX, os.X_OK) and DEBIAN_CONF.is_file()),
    reason="Debian's nginx is not installed (apt-get install nginx)",
)


def _certificate(directory: Path) -> None:
    directory.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={HOST}",
         "-keyout", str(directory / "privkey.pem"), "-out", str(directory / "fullchain.pem")],
        check=True, capture_output=True, timeout=60,
    )


def _configure(tmp: Path, upstream: int, tls: int, plain: int) -> Path:
    """Debian's nginx.conf including the page's block, everything under ``tmp``."""
    page = ROOT / "docs" / "operations.md"
    block = replaced(only_block(page, "nginx").text, {
        "listen 443 ssl;": f"listen 127.0.0.1:{tls} ssl;",
        "listen 80;": f"listen 127.0.0.1:{plain};",
        f"/etc/letsencrypt/live/{HOST}/": f"{tmp}/tls/",
        "/var/log/nginx/": f"{tmp}/logs/",
        "http://127.0.0.1:8000": f"http://127.0.0.1:{upstream}",
    }, "the nginx block of docs/operations.md")
    (tmp / "kandev.conf").write_text(block)
    local = {
        "pid /run/nginx.pid;": f"pid {tmp}/nginx.pid;",
        "/var/log/nginx/": f"{tmp}/logs/",
        "include /etc/nginx/conf.d/*.conf;": f"include {tmp}/kandev.conf;",
        "include /etc/nginx/sites-enabled/*;": "",  # the page says: remove the default site
    }
    if os.geteuid() != 0:  # no user switch, temp files where we may write
        local["user www-data;"] = ""
        local["http {"] = "http {\n" + "".join(
            f"{kind}_temp_path {tmp}/{kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
    conf = tmp / "nginx.conf"
    conf.write_text(replaced(DEBIAN_CONF.read_text(), local, str(DEBIAN_CONF)))
    (tmp / "logs").mkdir()
    return conf


def _listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx did not listen on {port}:\n{log.read_text()}")


def _get(port: int, target: str, tls: bool) -> tuple[int, dict[str, str], bytes]:
    if tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        connection: HTTPConnection = HTTPSConnection(
            "127.0.0.1", port, timeout=20, context=context
        )
    else:
        connection = HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        connection.request("GET", target, headers={"Host": HOST})
        answer = connection.getresponse()
        return answer.status, dict(answer.headers), answer.read()
    finally:
        connection.close()


def _audit_link(settings: Settings, server: ServedProcess) -> str:
    created = http("POST", server.base + "/api/v1/tasks", server.token,
                   {"workspace_id": server.workspace_id, "title": "t", "external_id": "PROXY-1"})
    assert created.status == 200, created.body
    history = run_cli(settings, "identity", "history", "--workspace", server.workspace_id,
                      "--external-id", "PROXY-1", KANDEV_PUBLIC_URL=f"https://{HOST}")
    assert history.returncode == 0, history.stderr
    [link] = [w for w in history.stdout.split() if w.startswith(f"https://{HOST}/audit/")]
    return link.removeprefix(f"https://{HOST}")


def test_the_documented_proxy_logs_no_audit_secret_and_answers_503_json_without_upstream(
    tmp_path,
):
    settings = Settings(data_dir=tmp_path / "data")
    server = ServedProcess(settings, tmp_path)
    tls, plain = free_port(), free_port()
    _certificate(tmp_path / "tls")
    conf = _configure(tmp_path, server.port, tls, plain)
    startup = tmp_path / "logs" / "startup.log"
    nginx = subprocess.Popen(
        [NGINX, "-p", str(tmp_path), "-c", str(conf), "-e", str(startup), "-g", "daemon off;"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=startup.open("wb"),
    )
    try:
        _listening(tls, nginx, startup)
        _listening(plain, nginx, startup)
        target = _audit_link(settings, server)
        secret = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)["audit_link"][0]

        status, _, page = _get(tls, target, tls=True)
        assert status == 200 and b"PROXY-1" in page
        status, headers, _ = _get(plain, target, tls=False)
        assert status == 301 and headers["Location"] == f"https://{HOST}{target}"

        server.stop()
        for path in (target, "/api/v1/workspaces"):
            status, headers, body = _get(tls, path, tls=True)
            assert status == 503, body
            assert headers["Content-Type"] == "application/json"
            assert headers["Retry-After"] == "1" and headers["Cache-Control"] == "no-store"
            answer = json.loads(body)
            assert answer["error"] == Unavailable.code and ApiErrorSchema().validate(answer) == {}
            assert re.fullmatch("[0-9a-f]{32}", answer["request_id"])
            assert headers["X-Request-Id"] == answer["request_id"]
    finally:
        server.stop()
        nginx.send_signal(signal.SIGQUIT)  # graceful: every log line written out
        nginx.wait(timeout=30)

    written = {path.name: path.read_bytes() for path in (tmp_path / "logs").iterdir()}
    assert not [name for name, text in written.items() if secret.encode() in text]
    access = written["kandev.log"].decode()
    assert '"GET /audit/identities" 200' in access and '"GET /audit/identities" 301' in access
    assert "upstream_status=502" in access  # the stopped upstream, said without the request
    assert b"audit_link" not in b"".join(written.values())
