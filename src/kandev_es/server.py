"""Running the API: first-start setup, and gunicorn as the process manager."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import click

from kandev_es import metrics
from kandev_es.background import supervisor
from kandev_es.config import Settings, served_url_file

TOKEN_HOWTO = "make a token with `kandev-es token create --admin` (or `--workspace NAME`)"


def first_start(settings: Settings, host: str, port: int) -> None:
    """On an empty store only (nothing stored yet: the embedded first start, or
    a fresh database nobody set up), create the `default` workspace and an
    admin token and show them; a store that holds anything (the PostgreSQL
    runbook's `workspace create`, `token create`) gets neither. A secret is
    shown only on a text log stream: with KANDEV_LOG_FORMAT=json no token is
    made and one JSON line says how to get one (a log shipper keeps stderr)."""
    # Imported here: http/gunicorn.conf.py imports this module into the gunicorn
    # master, which should load no application code before its workers fork.
    from kandev_es.bootstrap import bootstrap

    services = bootstrap(settings.with_overrides(create_tables=False))
    try:
        if services.app.max_notification_id() > 0:
            existing = services.workspaces.get_by_name("default")
            named = f"workspace default = {existing.id}; " if existing else ""
            _say(settings, f"kandev-es: {named}{TOKEN_HOWTO}")
            return
        workspace, _ = services.workspaces.ensure("default")
        if settings.log_format == "json":
            _say(
                settings,
                f"kandev-es: created workspace default = {workspace.id}; {TOKEN_HOWTO}"
                " (no token is shown in JSON logs)",
            )
            return
        secret, _ = services.tokens.issue(workspace_id=None, admin=True, label="first start")
    finally:
        services.close()
    base = f"http://{host}:{port}"
    # Read-only: the tours' first create (JIRA-1) must still answer created after it.
    click.echo(
        "\n".join(
            [
                f"kandev-es: created workspace default = {workspace.id}",
                f"kandev-es: admin token (shown once): {secret}",
                "kandev-es: try it (lists the workspace's tasks; creates nothing):",
                f"  curl -s {base}/api/v1/workspaces/{workspace.id}/tasks"
                f" -H 'Authorization: Bearer {secret}'",
            ]
        ),
        err=True,
    )


def _say(settings: Settings, line: str) -> None:
    """One line on stderr: a log record where lines are JSON, else as it is."""
    if settings.log_format == "json":
        logging.getLogger("kandev_es").warning(line)
    else:
        click.echo(line, err=True)


def background_layout(settings: Settings) -> str:
    """Where this server's background work runs (config.Settings.background):
    unset, in one background process beside the web workers."""
    return settings.background or "process"


def gunicorn_settings(
    settings: Settings, threads: int, timeout: int = 60, log_level: str | None = None
) -> dict[str, Any]:
    """The gunicorn settings `kandev-es serve` and http/gunicorn.conf.py share:
    `threads` request threads per worker, hooks, logging; with the background
    process (KANDEV_BACKGROUND unset or process), the master's hooks that start
    it (at ``log_level``) and stop it (background/supervisor.py)."""
    # Imported here: the master needs it only when it starts (not for the CLI's --help).
    from kandev_es.http_worker import worker_class

    hooks = {}
    if background_layout(settings) == "process":
        hooks = supervisor.hooks(settings, log_level)
    return {
        **hooks,
        # gunicorn supervises, waitress serves: a request reaches a thread only
        # once it has fully arrived, within bounded times (http_worker.py).
        "worker_class": worker_class(settings),
        # Each open stream holds a thread; give the capped streams their
        # own so `threads` stay free for requests (streams beyond get 503).
        "threads": threads + settings.max_streams,
        # The access line is the app's own (observability/middleware.py: with
        # the request id, in text or JSON, redacted), whatever server runs it.
        "accesslog": None,
        # Audit links carry a secret in the query string: never logged.
        # (a dotted name: gunicorn imports it only when it starts).
        "logger_class": "kandev_es.access_log.RedactingLogger",
        "timeout": timeout,
        "graceful_timeout": 10,
        "control_socket_disable": True,
        # Workers share their metrics through files (docs/operations.md: Metrics): once, in
        # the master before any worker forks, a fresh directory named to them;
        # a dead worker's live gauges leave /metrics, its counters stay.
        "on_starting": lambda server: metrics.start_multiprocess(settings),
        "child_exit": lambda server, worker: metrics.worker_exited(worker.pid),
    }


def run_server(settings: Settings, host: str, port: int, workers: int | None, threads: int) -> None:
    from gunicorn.app.base import BaseApplication

    # SQLite has one writer: one worker process with threads. PostgreSQL scales out.
    worker_count = workers or (2 if settings.backend == "postgres" else 1)
    # The background process logs at serve's level (`kandev-es --log-level debug serve`).
    log_level = logging.getLevelName(logging.getLogger().level)
    # Web workers run the background work only in the "threads" layout.
    in_workers = background_layout(settings) == "threads"

    class _Gunicorn(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            options = {
                "bind": f"{host}:{port}",
                "workers": worker_count,
                **gunicorn_settings(settings, threads, log_level=log_level),
            }
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            from kandev_es.api import create_app

            return create_app(settings, run_projections=in_workers)

    _Gunicorn().run()


@contextlib.contextmanager
def served_at(settings: Settings, url: str) -> Iterator[None]:
    """While this server runs, its data dir says where it listens, so the
    commands run beside it link to it (config.audit_base_url: an audit link
    names `serve --port`'s port without KANDEV_PUBLIC_URL)."""
    path = served_url_file(settings)
    with contextlib.suppress(OSError):  # a read-only data dir still serves
        path.write_text(url + "\n", encoding="utf-8")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8").strip() == url:
                path.unlink()
