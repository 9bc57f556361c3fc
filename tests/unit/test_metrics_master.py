"""A gunicorn master that recorded a metric before naming the workers' shared
directory (first start's store work does: a PostgreSQL pool's first checkout
waits) still hands its workers instruments that write to that directory, so a
scrape adds up every worker (docs/operations.md: Metrics). Run in a child
process: prometheus_client's mode is per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MASTER_THEN_WORKER = """
import os, sys
from pathlib import Path
from kandev_es import metrics
from kandev_es.config import load_settings

metrics.record_pool_wait()  # the master, before on_starting
directory = metrics.start_multiprocess(load_settings())
pid = os.fork()
if pid == 0:  # a worker
    metrics.record_creation("created")
    os._exit(0 if metrics.instruments().shared == directory else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "the worker's instruments are not shared"
files = sorted(p.name for p in directory.glob("*.db"))
assert f"counter_{pid}.db" in files, files
"""


def test_a_master_that_recorded_early_still_gives_its_workers_shared_metrics(tmp_path: Path):
    env = {"KANDEV_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", MASTER_THEN_WORKER], env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
