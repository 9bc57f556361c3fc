"""`kandev-es serve` (and `mcp --http`) on an address another server holds (issue 35 point 7):
one line naming the address and exit 1, before anything starts or is created
(before, gunicorn printed `Connection in use` for 5 s, then a misleading
`Can't connect to ...`)."""

from __future__ import annotations

from pathlib import Path

from kandev_es.config import Settings
from tests.support.served import ServedProcess, run_cli


def test_serve_on_a_port_a_served_process_holds_exits_1_naming_the_address(tmp_path: Path):
    holder = ServedProcess(Settings(data_dir=tmp_path / "holder"), tmp_path)
    try:
        second = Settings(data_dir=tmp_path / "second")
        refused = run_cli(second, "serve", "--host", "127.0.0.1", "--port", str(holder.port))
        assert refused.returncode == 1, refused.stderr
        assert refused.stdout == ""
        assert refused.stderr.splitlines() == [
            f"Error: cannot listen on 127.0.0.1:{holder.port}: Address already in use"
        ]
        assert not second.data_dir.exists()  # no store, no first-start token
        assert holder.process.poll() is None  # the holder kept serving
    finally:
        holder.stop()


def test_mcp_over_http_on_a_port_a_served_process_holds_exits_1_naming_the_address(
    tmp_path: Path,
):
    holder = ServedProcess(Settings(data_dir=tmp_path / "holder"), tmp_path)
    try:
        second = Settings(data_dir=tmp_path / "second")
        refused = run_cli(
            second, "mcp", "--http", "--host", "127.0.0.1", "--port", str(holder.port)
        )
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.splitlines() == [
            f"Error: cannot listen on 127.0.0.1:{holder.port}: Address already in use"
        ]
        assert not second.data_dir.exists()  # no store was made for a server that cannot listen
        assert holder.process.poll() is None
    finally:
        holder.stop()
