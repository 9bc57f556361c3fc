"""`kandev-es db init` from any number of processes at once (the systemd unit
runs it in ExecStartPre, so nodes starting together run it together): every
one exits 0 and the store ends with one schema, the one a single `db init`
makes. Before the setup lock, two at once on an initialised PostgreSQL store
failed with "tuple concurrently updated" (2 of 6 tries)."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from kandev_es.bootstrap import init_storage
from tests.conftest import postgres_admin_url
from tests.support.served import environment, kandev_command

PROCESSES = 8


def _db_init_at_once(settings) -> list[subprocess.CompletedProcess[str]]:
    env = environment(settings)
    started = [
        subprocess.Popen(
            [*kandev_command(), "db", "init"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(PROCESSES)
    ]
    done = []
    for process in started:
        out, err = process.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def _schema(settings) -> list[tuple[str, ...]]:
    """Every object of the store: tables, indexes, sequences, functions."""
    if settings.postgres is None:
        import sqlite3

        with sqlite3.connect(settings.sqlite_path) as connection:
            rows = connection.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
        return sorted(tuple(str(v) for v in row) for row in rows)
    import psycopg

    target = settings.postgres
    with psycopg.connect(target.conninfo) as connection:
        relations = connection.execute(
            "SELECT c.relkind::text, c.relname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (target.schema,),
        ).fetchall()
        functions = connection.execute(
            "SELECT 'f', p.proname || pg_get_function_identity_arguments(p.oid) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
            (target.schema,),
        ).fetchall()
        schemas = connection.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (target.schema,)
        ).fetchone()
    assert schemas == (1,)
    return sorted([*relations, *functions])


def _all_succeeded(runs: list[subprocess.CompletedProcess[str]]) -> None:
    failed = [(run.returncode, run.stderr) for run in runs if run.returncode != 0]
    assert not failed, failed
    assert all(run.stdout.startswith("initialised ") for run in runs)


def test_eight_db_inits_at_once_on_a_fresh_and_an_initialised_store_all_succeed(settings):
    fresh = _db_init_at_once(settings)
    _all_succeeded(fresh)
    made = _schema(settings)
    assert any("tasks_view" in row for row in made)

    again = _db_init_at_once(settings)
    _all_succeeded(again)
    assert _schema(settings) == made

    init_storage(settings)  # what one more db init, alone, leaves
    assert _schema(settings) == made



@pytest.fixture
def limited_role():
    """A login role that may connect but create nothing (PostgreSQL 15's default)."""
    import psycopg
    from psycopg import sql

    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_admin_url(), autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield role
    with psycopg.connect(postgres_admin_url(), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_db_init_without_the_right_to_create_is_one_line_naming_the_reason(
    settings, tmp_path, request
):
    if settings.postgres is None:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        settings = settings.with_overrides(data_dir=blocker / "data")
        reason = "Not a directory"
    else:
        role = request.getfixturevalue("limited_role")
        url = settings.database_url.replace("://postgres@", f"://{role}@", 1)
        assert url != settings.database_url
        settings = settings.with_overrides(database_url=url)
        reason = "permission denied"
    run = subprocess.run(
        [*kandev_command(), "db", "init"], env=environment(settings), capture_output=True,
        text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 1
    [line] = run.stderr.splitlines()
    assert line.startswith("Error: cannot set up the store at ") and reason in line, line
