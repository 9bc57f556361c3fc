"""The access log blanks an audit link's secret (and any bearer secret) in
every atom gunicorn would write: request line, query string, referer."""

from __future__ import annotations

from kandev_es.access_log import redact

SECRET = "kal_Yan8suhNgxAT37rBfas9L1RH1E0cv_2673dlp9K1g_g"


def test_the_link_parameter_and_secrets_by_prefix_are_blanked() -> None:
    line = f"GET /audit/identities?workspace=w&external_id=E&audit_link={SECRET} HTTP/1.1"
    assert redact(line) == (
        "GET /audit/identities?workspace=w&external_id=E&audit_link=[redacted] HTTP/1.1"
    )
    assert SECRET not in redact(f"audit%5Flink={SECRET}&x=1")
    assert SECRET not in redact(f"http://h/audit/identities?audit_link={SECRET}")  # referer
    assert redact("Bearer kes_abc-DEF_123") == "Bearer kes_[redacted]"
    assert SECRET not in redact(f"?AUDIT_LINK={SECRET[4:]}")


def test_ordinary_lines_are_unchanged() -> None:
    line = "GET /api/v1/workspaces/w/tasks/by-external-id?external_id=JIRA-1 HTTP/1.1"
    assert redact(line) == line
    assert redact("external_id=skalpel_1") == "external_id=skalpel_1"


def test_the_quick_test_before_the_expression_skips_no_line_it_would_change() -> None:
    """redaction.redact skips its regular expression when a line holds none of
    the markers a secret needs: every spelling the expression matches must
    still be caught (an added alternative needs its marker)."""
    from kandev_es import redaction

    lines = [
        f"?audit_link={SECRET}", f"?AUDIT%5FLINK={SECRET}", f"?Audit_Link={SECRET}",
        "Bearer KES_abc", "x kal_abc", "postgresql://user:pw@host/db", "PASSWORD=pw&x",
        "postgresql://host/db?Password=pw", "GET /api/v1/tasks HTTP/1.1 200",
        "kal", "link", "://nohost", "secret_kes", "external_id=skalpel_1",
        "whsec_ab+/=", "WHSK_x", "Authorization: Bearer abc", "bearer xyz", "access_token=t",
        '{"Secret": "s"}', "passwd: p", "API-KEY=k", "apikey=k", "signature: v1,x",
        "db_password=x", "tokens", "signed",
    ]
    for line in lines:
        assert redaction.redact(line) == redaction._SECRETS.sub(redaction._blank, line), line


def test_what_a_webhook_receiver_echoes_is_blanked_by_the_same_rules() -> None:
    """The delivery log's snippet (webhooks/transport.py) goes through this
    one redaction: webhook secrets by prefix, bearer credentials, and the
    values of secret-like fields however they are quoted."""
    from kandev_es.webhooks.transport import _snippet

    echoed = (
        b'{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "ok": 1}\n'
        b"Authorization: Bearer opaque-123; api_key=k9 token: t0k kes_abc"
    )
    shown = _snippet(echoed)
    for leaked in ("MfKQ9r8", "opaque-123", "k9", "t0k", "abc"):
        assert leaked not in shown, shown
    assert '"ok": 1' in shown and "\n" not in shown
    assert redact("Bearer kes_abc-DEF_123") == "Bearer kes_[redacted]"
