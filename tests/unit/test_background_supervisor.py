"""The gunicorn master's supervisor of the background process
(background/supervisor.py), with real child processes: a child that ends is
started again, with a growing wait while it keeps ending; stop() ends the one
running (SIGTERM, then SIGKILL) and nothing is started after it. And what the
child is given: the master's store (serve's --data-dir / --database-url are
not in the environment), its log level, its pid and the agents' API URL; and
KANDEV_BACKGROUND's values."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kandev_es.background import supervisor
from kandev_es.background.supervisor import Supervisor, command, environment
from kandev_es.config import Settings, load_settings
from kandev_es.errors import InvalidSetting
from kandev_es.server import background_layout, gunicorn_settings


def _wait_for(probe, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_child_that_ends_is_started_again_and_stop_ends_the_running_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "RESTART_SECONDS", 0.05)
    marks = tmp_path / "starts"
    # Each start leaves a line, then ends at once: the supervisor starts another.
    script = f"open({str(marks)!r}, 'a').write('x\\n')"
    running = Supervisor([sys.executable, "-c", script], {})
    running.start()
    _wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 3)
    running.stop()
    assert running.starts >= 3
    # ending fast, the waits double: 0.05, 0.1, 0.2, ... (not a start per 50 ms)
    assert running.starts <= 6
    settled = len(marks.read_text().splitlines())
    time.sleep(0.5)
    assert len(marks.read_text().splitlines()) == settled  # nothing started after stop()


def test_stop_terminates_a_running_child_and_kills_one_that_ignores_it(tmp_path: Path) -> None:
    polite = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], {})
    polite.start()
    pid = polite.pid
    started = time.monotonic()
    polite.stop()
    assert time.monotonic() - started < 5
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert polite.starts == 1

    ready = tmp_path / "ready"
    stubborn_script = (
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f" pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    stubborn = Supervisor([sys.executable, "-c", stubborn_script], {})
    stubborn.start()
    _wait_for(ready.exists)
    started = time.monotonic()
    stubborn.stop(seconds=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert stubborn.starts == 1


def test_a_reload_starts_the_next_one_at_once(tmp_path: Path) -> None:
    running = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], {})
    running.start()
    first = running.pid
    running.renew()
    _wait_for(lambda: running.pid != first, 5.0)  # no restart wait after a reload
    assert running.starts == 2
    running.stop()


def test_the_child_gets_the_masters_store_level_pid_and_agent_url() -> None:
    settings = Settings(data_dir=Path("/srv/data"), agent_api_url="http://127.0.0.1:9001")
    args = command(settings, 4242, "info")
    assert args[:3] == [sys.executable, "-m", "kandev_es.cli"]
    assert args[3:] == [
        "--log-level",
        "INFO",
        "background",
        "--parent",
        "4242",
        "--agent-api-url",
        "http://127.0.0.1:9001",
    ]
    assert "--log-level" not in command(settings, 1, "NOTSET")
    base = {"KANDEV_DATABASE_URL": "postgresql://elsewhere/db", "PATH": "/bin"}
    env = environment(settings, base)
    # serve --data-dir on SQLite: the variable's PostgreSQL URL must not win in the child
    assert env == {"KANDEV_DATA_DIR": "/srv/data", "KANDEV_CREATE_TABLES": "n", "PATH": "/bin"}
    postgres = settings.with_overrides(database_url="postgresql://u@db/kandev")
    assert environment(postgres, base)["KANDEV_DATABASE_URL"] == "postgresql://u@db/kandev"


def test_the_layouts_and_which_start_a_background_process(tmp_path: Path) -> None:
    assert load_settings({}).background == ""
    for layout in ("process", "threads", "external"):
        settings = load_settings({"KANDEV_BACKGROUND": layout.upper()})
        assert settings.background == layout
        hooks = gunicorn_settings(settings.with_overrides(data_dir=tmp_path), 1)
        assert ("when_ready" in hooks) == (layout == "process")
        assert ("on_exit" in hooks) == (layout == "process")
        assert ("on_reload" in hooks) == (layout == "process")
    assert background_layout(load_settings({})) == "process"  # serve's default
    with pytest.raises(InvalidSetting, match="KANDEV_BACKGROUND must be process, threads or"):
        load_settings({"KANDEV_BACKGROUND": "workers"})
