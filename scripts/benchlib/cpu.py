"""CPU time of processes from /proc, and PostgreSQL's side of a load (its
processes' CPU and its transaction counters)."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

import psycopg

from benchlib.database import stat_counters
from kandev_es.config import postgres_target


def ppid_of(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[1])


def cpu_ns(pid: int) -> int:
    """CPU time of a process in ns: the sum of its threads' run time
    (/proc/<pid>/task/*/schedstat; a thread that exited no longer counts)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total


def own_cpu_ns() -> int:
    """CPU time of this process in ns, its exited threads included (a bench's
    client threads end before the reading after a load; cpu_ns would lose them)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int((usage.ru_utime + usage.ru_stime) * 1e9)


def family_cpu(parent: int) -> dict[int, int]:
    """CPU ns of ``parent`` and of each of its child processes."""
    found = {parent: cpu_ns(parent)}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ppid_of(int(entry)) == parent:
            found[int(entry)] = cpu_ns(int(entry))
    return found


def cpu_delta(before: dict[int, int], after: dict[int, int]) -> int:
    """CPU used between two readings by the processes alive at the second
    (one that started in between counts from zero)."""
    return sum(ns - before.get(pid, 0) for pid, ns in after.items())


class PostgresSide:
    """PostgreSQL's own CPU (every child of the postmaster: backends, WAL
    writer, checkpointer...; /proc/<pid>/stat) and its transaction counters.
    None for CPU when the server is not on this machine."""

    def __init__(self, admin_url: str) -> None:
        self.conninfo = postgres_target(admin_url).conninfo
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            # While the connection is open: its backend exits when it closes,
            # and a gone process has no parent to read.
            self.postmaster = ppid_of(int(row[0]))

    def cpu(self) -> dict[int, int] | None:
        if self.postmaster is None:
            return None
        return family_cpu(self.postmaster)

    def counters(self) -> tuple[int, int]:
        """(xact_commit of this database as last flushed, next transaction id)."""
        return stat_counters(self.conninfo)
