"""Thin, typed wrappers over the git command line (real repositories only)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path

from kandev_es.config import git_environment
from kandev_es.errors import InternalError


class GitError(InternalError):
    """A git command failed; the step that ran it decides what that means."""


# How often a git command that may be stopped looks at its stop signal.
STOP_POLL_SECONDS = 0.1


class GitStopped(GitError):
    """The command was stopped (its creation's lease was lost) before it ended."""


def git(
    repo: Path | str, *args: str, check: bool = True, stop: threading.Event | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git in ``repo``. With ``stop``: the command (and its hooks, in a
    process group of their own) is killed as soon as ``stop`` is set, and
    ``GitStopped`` raised."""
    command = ["git", "-C", str(repo), *args]
    if stop is not None:
        return _stoppable(command, stop, check)
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=git_environment(),
        timeout=60,
        check=False,
    )
    if check and result.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _stoppable(
    command: list[str], stop: threading.Event, check: bool
) -> subprocess.CompletedProcess[str]:
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=git_environment(),
        process_group=0,
    ) as process:
        while True:
            try:
                out, err = process.communicate(timeout=STOP_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                if stop.is_set():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.communicate()
                    raise GitStopped(f"git {' '.join(command[3:])} stopped") from None
    result = subprocess.CompletedProcess(command, process.returncode, out, err)
    if check and result.returncode != 0:
        raise GitError(f"git {' '.join(command[3:])} failed: {err.strip()}")
    return result


def branch_exists(repo: Path | str, branch: str) -> bool:
    result = git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    return result.returncode == 0


def branch_marker(repo: Path | str, branch: str) -> str | None:
    result = git(repo, "config", "--get", f"branch.{branch}.kandevtask", check=False)
    return result.stdout.strip() or None


def worktree_paths(repo: Path | str) -> set[str]:
    listing = git(repo, "worktree", "list", "--porcelain").stdout
    return {
        str(Path(line.split(" ", 1)[1]).resolve())
        for line in listing.splitlines()
        if line.startswith("worktree ")
    }


def worktrees_on_branch(repo: Path | str, branch: str) -> list[str]:
    """The worktrees (paths as git lists them) that have ``branch`` checked out."""
    listing = git(repo, "worktree", "list", "--porcelain").stdout
    found, path = [], None
    for line in listing.splitlines():
        if line.startswith("worktree "):
            path = line.split(" ", 1)[1]
        elif line == f"branch refs/heads/{branch}" and path is not None:
            found.append(path)
    return found


def is_repository(path: Path | str) -> bool:
    inside = git(path, "rev-parse", "--is-inside-work-tree", check=False)
    head = git(path, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    return inside.returncode == 0 and head.returncode == 0


def is_work_tree_top(path: Path | str) -> bool:
    """``path`` is the top of its own git work tree: not a plain folder inside
    an enclosing repository's work tree (whose branches, worktrees and config
    a command run there would change instead)."""
    if not Path(path).is_dir():
        return False
    top = git(path, "rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or not top.stdout.strip():
        return False
    return Path(top.stdout.strip()).resolve() == Path(path).resolve()
