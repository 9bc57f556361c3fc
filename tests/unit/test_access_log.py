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
