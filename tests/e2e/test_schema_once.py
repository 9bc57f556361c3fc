"""The schema is made once, before any worker starts (docs/operations.md:
Production on PostgreSQL): the production command's workers never create
tables themselves (several processes issuing CREATE TABLE at once fail with
"tuple concurrently updated"), so without `kandev-es db init` they start, say
so on /readyz, and leave the schema empty; `kandev-es serve` makes it in its
parent process before forking its workers."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import psycopg
import pytest

from kandev_es.config import Settings
from tests.support.served import (
    ROOT,
    Launched,
    ServedProcess,
    free_port,
    http,
)

WORKERS = "3"


def wait_healthy(process: Launched, base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.process.poll() is None:
        with contextlib.suppress(OSError):
            if http("GET", base + "/healthz", timeout=2).status == 200:
                return
        time.sleep(0.1)
    raise AssertionError("not healthy:\n" + process.log())


def tables_in(settings: Settings) -> list[str]:
    target = settings.postgres
    assert target is not None
    with psycopg.connect(target.conninfo) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (target.schema,),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_production_workers_never_create_tables_and_serve_makes_them_first(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    production = Launched(
        ["-c", str(ROOT / "http" / "gunicorn.conf.py"), "kandev_es.api:create_app()"],
        settings, tmp_path / "gunicorn.log", [sys.executable, "-m", "gunicorn"],
        KANDEV_BIND=f"127.0.0.1:{port}", KANDEV_WORKERS=WORKERS, KANDEV_THREADS="2",
    )
    try:
        wait_healthy(production, base)
        not_ready = [http("GET", base + "/readyz").status for _ in range(6)]
        assert set(not_ready) == {503}, not_ready
        assert tables_in(settings) == [], "a worker created tables"
    finally:
        production.stop()
    served = ServedProcess(settings, tmp_path, workers=int(WORKERS))
    try:
        assert http("GET", served.base + "/readyz").status == 200
        assert "concurrently updated" not in served.output()
        assert "events" in " ".join(tables_in(settings))
    finally:
        served.stop()
