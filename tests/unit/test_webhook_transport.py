"""The deliverer's HTTP/1.1 client (webhooks/transport.py) against real
servers on 127.0.0.1 that write their answers byte for byte: a connection
kept between deliveries only when its answer was read whole, a kept
connection the receiver closed replaced (the request sent once on the new
one), answers that are not HTTP a bounded failure, TLS verified (a
certificate nobody vouches for refused; one the client trusts, over SNI,
delivered)."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kandev_es.webhooks import transport
from kandev_es.webhooks.addresses import NetworkPolicy
from kandev_es.webhooks.transport import new_client, post

POLICY = NetworkPolicy.from_settings(("127.0.0.0/8", "::1/128"), True)
HEADERS = {"content-type": "application/json", "webhook-id": "msg_1"}

# (connection number, request number on it) -> the answer's bytes; None: close it
Script = Callable[[int, int], bytes | None]


class RawServer:
    """Reads each request (head and Content-Length body) and writes what
    ``script`` says, on as many connections as the client makes."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.requests: list[tuple[int, bytes]] = []  # (connection, request)
        self.connections = 0
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            buffer, nth = b"", 0
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                self.requests.append((number, head + b"\r\n\r\n" + buffer[:length]))
                buffer, nth = buffer[length:], nth + 1
                answer = self.script(number, nth)
                if answer is None:
                    return
                conn.sendall(answer)
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(script, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def deliver(url: str, count: int, timeout: float = 5.0) -> list[transport.Outcome]:
    with new_client(POLICY, timeout) as client:
        return [post(client, url, b'{"n": %d}' % n, HEADERS, timeout) for n in range(count)]


def test_a_connection_is_kept_while_answers_are_read_whole(serve) -> None:
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    chunked = (
        b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nhe\r\n3;x=1\r\nllo\r\n0\r\n\r\n"
    )
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"
    answers = [sized, chunked, interim, sized]
    server = serve(lambda conn, nth: answers[nth - 1])
    got = deliver(f"http://127.0.0.1:{server.port}/hook?a=b", 4)
    assert [(o.status, o.snippet) for o in got] == [
        (200, "ok"),
        (202, "hello"),
        (204, ""),
        (200, "ok"),
    ]
    assert server.connections == 1
    first = server.requests[0][1]
    assert first.startswith(b"POST /hook?a=b HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}\r\n".encode() in first and first.endswith(b'{"n": 0}')


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000,  # over SNIPPET_READ
    ],
    ids=["close", "http-1.0", "long-body"],
)
def test_an_answer_not_read_whole_or_closing_takes_its_connection_along(serve, answer) -> None:
    server = serve(lambda conn, nth: answer)
    got = deliver(f"http://127.0.0.1:{server.port}/", 2)
    assert [o.status for o in got] == [200, 200]
    assert server.connections == 2
    assert len(got[0].snippet) <= transport.SNIPPET_CHARS


def test_a_kept_connection_the_receiver_closed_is_replaced_and_the_request_sent_once(serve):
    # the first connection answers once and then closes without answering the next
    server = serve(
        lambda conn, nth: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" if nth == 1 else None
    )
    got = deliver(f"http://127.0.0.1:{server.port}/", 3)
    assert [o.status for o in got] == [200, 200, 200]
    bodies = [request.rsplit(b"\r\n\r\n", 1)[1] for _, request in server.requests]
    # each request answered once; the unanswered ones read again on a new connection
    assert [b for b in bodies if b == b'{"n": 0}'] == [b'{"n": 0}']
    assert bodies[-1] == b'{"n": 2}' and server.connections == 3


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "head is over"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "not a number"),
        (b"HTTP/1.1 200 OK\r\n no-name\r\n\r\n", "malformed header"),
        (None, "closed the connection without an answer"),
    ],
    ids=["not-http", "long-head", "bad-chunk", "bad-length", "bad-header", "closed"],
)
def test_what_is_not_one_http_answer_is_a_bounded_failure(serve, answer, said) -> None:
    server = serve(lambda conn, nth: answer)
    [outcome] = deliver(f"http://127.0.0.1:{server.port}/", 1)
    assert outcome.status is None and said in outcome.snippet, outcome
    assert not outcome.delivered


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert = tmp_path / "cert.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private = tmp_path / "key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, private


def test_tls_is_verified_by_name(serve, tmp_path, monkeypatch) -> None:
    cert, private = _certificate(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, private)
    server = serve(lambda conn, nth: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", server_side)
    url = f"https://localhost:{server.port}/hook"
    [refused] = deliver(url, 1)  # nobody the system trusts signed it
    assert refused.status is None and "certificate" in refused.snippet.lower(), refused
    trusting = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(transport, "_TLS", trusting)
    got = deliver(url, 2)
    assert [o.status for o in got] == [200, 200] and got[0].snippet == "ok"
    assert f"host: localhost:{server.port}\r\n".encode() in server.requests[-1][1]


def test_every_interim_answer_is_skipped_not_only_100(serve) -> None:
    # http.client skips a 100 itself; a 103 (or 102) is skipped here, its head read
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
    answer = hints + b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    server = serve(lambda conn, nth: answer)
    got = deliver(f"http://127.0.0.1:{server.port}/", 2)
    assert [(o.status, o.snippet) for o in got] == [(201, "ok"), (201, "ok")]
    assert server.connections == 1


def test_a_head_of_over_100_headers_is_a_bounded_failure(serve) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"X: a\r\n" * 101  # http.client's own limit
    server = serve(lambda conn, nth: head + b"Content-Length: 0\r\n\r\n")
    [outcome] = deliver(f"http://127.0.0.1:{server.port}/", 1)
    assert outcome.status is None and "head is over 100 headers" in outcome.snippet, outcome


def test_a_head_of_many_short_lines_is_cut_at_head_read(serve) -> None:
    # 90 headers of 800 bytes: each line and their count within http.client's
    # limits, the head over HEAD_READ bytes
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X%d: %s\r\n" % (n, b"a" * 800) for n in range(90))
    server = serve(lambda conn, nth: head + b"Content-Length: 0\r\n\r\n")
    [outcome] = deliver(f"http://127.0.0.1:{server.port}/", 1)
    assert outcome.status is None and "head is over" in outcome.snippet, outcome
