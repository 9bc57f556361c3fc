"""Where the audit links the CLI prints point (config.audit_base_url): the
KANDEV_PUBLIC_URL the operator set; else the address the `serve` of the same
data dir recorded while it runs (server.served_at; tests/e2e/test_docs_commands.py
opens such a link from the tour); else the default."""

from __future__ import annotations

from kandev_es.config import Settings, audit_base_url, load_settings, served_url_file
from kandev_es.server import served_at


def test_the_served_address_unless_kandev_public_url_is_set(tmp_path):
    unset = load_settings({"KANDEV_DATA_DIR": str(tmp_path)})
    given = load_settings({"KANDEV_DATA_DIR": str(tmp_path),
                      "KANDEV_PUBLIC_URL": "https://kandev.example.com"})
    assert audit_base_url(unset) == "http://127.0.0.1:8000"
    with served_at(unset, "http://127.0.0.1:8123"):
        assert served_url_file(unset).read_text() == "http://127.0.0.1:8123\n"
        assert audit_base_url(unset) == "http://127.0.0.1:8123"
        assert audit_base_url(given) == "https://kandev.example.com"
    assert not served_url_file(unset).exists()  # gone once the server stops
    assert audit_base_url(unset) == "http://127.0.0.1:8000"


def test_a_record_that_is_not_a_url_is_ignored(tmp_path):
    settings = Settings(data_dir=tmp_path)
    served_url_file(settings).write_text("garbage\n")
    assert audit_base_url(settings) == "http://127.0.0.1:8000"
