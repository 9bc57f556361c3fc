"""One database URL, one conninfo (config.postgres_target): both libpq
multi-host spellings and every libpq parameter reach the conninfo every
connection uses; a URL the service cannot honour is refused with one line
before anything connects."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from kandev_es.config import Settings, load_settings, postgres_target
from kandev_es.errors import InvalidSetting

FORMATION = {"host": "127.0.0.1,127.0.0.1", "port": "5433,5434"}


@pytest.mark.parametrize("url", [
    "postgresql://kandev@127.0.0.1:5433,127.0.0.1:5434/kandev?target_session_attrs=read-write",
    "postgresql://kandev@/kandev?host=127.0.0.1,127.0.0.1&port=5433,5434"
    "&target_session_attrs=read-write",
])
def test_both_multi_host_spellings_give_the_same_conninfo(url: str) -> None:
    params = postgres_target(url).as_dict()
    assert params == {
        **FORMATION, "dbname": "kandev", "user": "kandev",
        "target_session_attrs": "read-write", "connect_timeout": "2",
    }


def test_every_libpq_parameter_of_the_url_is_kept() -> None:
    target = postgres_target(
        "postgres://u:p%40ss@db.example/app?sslmode=require&connect_timeout=10"
        "&application_name=kes&options=-c%20statement_timeout%3D5s&schema=tenant_a"
    )
    assert target.as_dict() == {
        "host": "db.example", "dbname": "app", "user": "u", "password": "p@ss",
        "sslmode": "require", "connect_timeout": "10", "application_name": "kes",
        "options": "-c statement_timeout=5s",
    }
    assert target.schema == "tenant_a"


def test_the_schema_is_added_to_the_urls_own_options_for_the_read_models() -> None:
    from psycopg.conninfo import conninfo_to_dict

    target = postgres_target("postgresql://u@h/d?options=-c%20work_mem%3D8MB&schema=s1")
    assert conninfo_to_dict(target.schema_conninfo)["options"] == (
        "-c work_mem=8MB -c search_path=s1")
    assert "options" not in postgres_target("postgresql://u@h/d").as_dict()


def test_a_host_list_without_target_session_attrs_asks_for_the_read_write_node() -> None:
    assert postgres_target("postgresql://u@h1,h2/d").as_dict()["target_session_attrs"] == (
        "read-write")
    assert "target_session_attrs" not in postgres_target("postgresql://u@h1/d").as_dict()
    explicit = postgres_target("postgresql://u@h1,h2/d?target_session_attrs=primary")
    assert explicit.as_dict()["target_session_attrs"] == "primary"


def test_connect_timeout_defaults_to_the_pool_timeout_but_at_least_two_seconds() -> None:
    assert postgres_target("postgresql://u@h/d", 1).as_dict()["connect_timeout"] == "2"
    assert postgres_target("postgresql://u@h/d", 7).as_dict()["connect_timeout"] == "7"


@pytest.mark.parametrize("url, says", [
    ("mysql://u@h/d", "must be a postgresql:// URL"),
    ("postgresql://u@h/d?bogus=1", 'invalid URI query parameter: "bogus"'),
    ("postgresql://u@h1,h2,h3/d?port=1,2", "names 3 hosts but 2 ports"),
    ("postgresql://u@h:99999/d", "invalid port '99999'"),
    ("postgresql://u@h/d?port=abc", "invalid port 'abc'"),
    ("postgresql://u@h1,h2/d?target_session_attrs=standby", "the service writes"),
    ("postgresql://u@h1,h2/d?target_session_attrs=read-only", "the service writes"),
    ("postgresql://u@h/d?schema=a&schema=b", "at most one non-empty schema"),
])
def test_a_url_it_cannot_honour_is_one_line_naming_the_setting(url: str, says: str) -> None:
    with pytest.raises(InvalidSetting) as refused:
        postgres_target(url)
    assert says in refused.value.message
    assert refused.value.message.startswith("KANDEV_DATABASE_URL")
    assert "\n" not in refused.value.message


def test_load_settings_refuses_the_url_before_anything_connects() -> None:
    with pytest.raises(InvalidSetting):
        load_settings({"KANDEV_DATABASE_URL": "postgresql://u@h/d?bogus=1"})
    assert Settings().postgres is None


def test_a_refused_url_does_not_echo_its_password() -> None:
    with pytest.raises(InvalidSetting) as refused:
        postgres_target("postgresql://u:secret@h/d?bogus=1&password=other")
    assert "secret" not in refused.value.message and "other" not in refused.value.message
