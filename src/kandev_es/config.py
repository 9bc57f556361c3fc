"""Settings, read from the environment in this one place."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from kandev_es.errors import InvalidSetting


@dataclass(frozen=True)
class Settings:
    """Everything the composition root needs to wire storage and adapters."""

    data_dir: Path = Path(".kandev-es")
    database_url: str | None = None
    # Workers run with table creation off; `kandev-es db init` creates them once.
    create_tables: bool = True
    pool_size: int = 5
    max_body_bytes: int = 1_048_576
    # The most items of a batch of creates (POST /api/v1/tasks/batch; its
    # body is bounded by max_body_bytes like any other).
    batch_max_items: int = 1_000
    # Seconds a request's headers, and its whole body, may take from its first
    # byte; seconds a connection may stay open without a request; connections
    # one worker process holds open (docs/security.md: Input limits and streams).
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    # Seconds an answer (an event stream) may wait for its client to take a
    # byte before the connection is closed (waitress' channel_timeout).
    send_timeout: int = 60
    max_connections: int = 2048
    # What a request's head may hold (gunicorn's defaults): the request line
    # (414 past it), header fields and bytes per field (431 past either).
    max_request_line: int = 4094
    max_header_fields: int = 100
    max_header_field_bytes: int = 8190
    # Bytes of a request body a worker holds in memory while it arrives; the rest
    # goes to a temporary file (docs/security.md: Input limits and streams).
    body_memory_bytes: int = 16384
    # Aggregates a worker keeps in memory (docs/operations.md: Worker memory):
    # snapshots for reads, and the event store library's aggregate cache.
    snapshot_cache_size: int = 20_000
    aggregate_cache_size: int = 20_000
    projection_poll_seconds: float = 0.2
    # None: the CLI picks (WARNING for one-shot commands, INFO for serve).
    log_level: str | None = None
    lease_seconds: float = 30.0
    # Bounded recovery (docs/architecture.md "Creation steps, recovery, release"): a step
    # whose effect is made but never proven runs at most step_attempts times;
    # the Runtime takes one creation over at most recovery_attempts times, the
    # n-th takeover waiting recovery_backoff_seconds * 2**(n-2) past the lease.
    step_attempts: int = 3
    recovery_attempts: int = 5
    recovery_backoff_seconds: float = 5.0
    # Shell-style command line of the agent launched for start_agent tasks.
    agent_command: str = f"{sys.executable} -m kandev_es.agent.demo"
    public_url: str = "http://127.0.0.1:8000"
    # Whether KANDEV_PUBLIC_URL was set; unset, `identity history` links to where
    # this data dir's `serve` listens (served_url_file), else to public_url.
    public_url_given: bool = False
    # The API's URL for agents on this host (their KANDEV_API_URL): the address
    # the server listens on -- serve's --host/--port, else the production
    # command's KANDEV_BIND -- not KANDEV_PUBLIC_URL, which is for browsers
    # (audit links). None (a unix socket bind): KANDEV_PUBLIC_URL.
    agent_api_url: str | None = "http://127.0.0.1:8000"
    # "<step>:<before|after>": SIGKILL this process once at that boundary (crash tests).
    failpoint: str | None = None
    # The background work (background/) includes the recovery Runtime; off, it
    # is left to a separate `kandev-es runtime`.
    runtime_in_process: bool = True
    # Where a server's background work runs (KANDEV_BACKGROUND, BACKGROUND_LAYOUTS):
    # "process", one `kandev-es background` per node that `serve` and
    # http/gunicorn.conf.py start beside the web workers; "threads", in every
    # web worker; "external", neither (an operator runs `kandev-es background`).
    # "" (unset): "process" under serve and gunicorn.conf.py, "threads" for
    # create_app() in any other WSGI server (as before the process existed).
    background: str = ""
    # "y" pings each pooled connection before use (one more round trip per load);
    # off, a dead connection fails its query and the event store retries it.
    pg_pre_ping: str = "n"
    # Seconds a store call waits for a PostgreSQL connection before it fails
    # with a 503 (the library's default of 5, retried 10 times, hung ~50 s).
    pg_connect_timeout: int = 1
    # Open SSE streams per worker process and per token; `serve` adds the
    # per-worker number to its threads so streams never hold request threads.
    max_streams: int = 32
    # Directories repositories may be registered from (empty: the data dir's repos/).
    repository_roots: tuple[Path, ...] = ()
    max_streams_per_token: int = 8
    # Extra environment names an operator lets through to agents (KANDEV_AGENT_ENV).
    agent_env: tuple[str, ...] = ()
    # KANDEV_LOG_FORMAT: "text" (default) or "json", one object per line
    # (docs/observability.md).
    log_format: str = "text"
    # OpenTelemetry traces (the otel extra), from the standard OTEL_* variables:
    # off unless an exporter or an OTLP endpoint is named (docs/observability.md).
    tracing: bool = False
    trace_exporter: str = "otlp"
    # Seconds a run credential lives when its run's end is never observed.
    run_token_ttl: float = 24 * 3600.0
    # Seconds an audit link (``identity history``'s link to the auditor's page) works.
    audit_link_seconds: float = 900.0
    # Agents started through run credentials and running at once: per starting
    # run, and per workspace (docs/security.md: Agent fan-out).
    max_agents_per_run: int = 4
    max_run_agents_per_workspace: int = 16
    # Tamper-evident history (docs/auditing.md): the sequencer signs a checkpoint
    # once this many seconds passed or this many events were added since the last.
    ledger_checkpoint_seconds: float = 2.0
    ledger_checkpoint_events: int = 1000
    # The checkpoint signing key (made at first start, mode 0600; None: the data
    # dir's ledger.key) and the log's origin line, used when the first key is
    # made (None: kandev-es.local/log/<a random deployment id>, services/ledger_keys.py).
    ledger_key_file: Path | None = None
    ledger_origin: str | None = None
    # Off: saves write no chain hash (the sequencer still chains every event it
    # logs); for measuring what chains cost (scripts/bench), docs/auditing.md.
    ledger_save_chains: bool = True
    # Off: a task's free text is stored in cleartext (event format 0), which
    # cannot be forgotten; for measuring what sealing costs (scripts/bench),
    # docs/auditing.md: Erasure.
    seal_free_text: bool = True
    # C2SP tlog-witnesses the sequencer asks to cosign each checkpoint it signs
    # (their URL prefixes; docs/auditing.md, "Witnesses").
    ledger_witness_urls: tuple[str, ...] = ()
    # The interactive API page at /api/docs (api/api_docs.py); off: 404 there.
    api_docs: bool = True
    # Webhooks (docs/webhooks.md): plain http allowed (tests, a trusted network);
    # networks a webhook URL may reach although private (CIDRs); the retry
    # schedule (seconds before each retry of one event; past its end the
    # subscription is disabled); one attempt's time bound; how long a rotated
    # secret keeps signing beside the new one; the v1a signing key (None: the
    # data dir's webhook.key); whether serve's workers run the deliverer
    # (off: `kandev-es webhook deliver` beside them).
    webhook_allow_http: bool = False
    webhook_allow_networks: tuple[str, ...] = ()
    webhook_retry_schedule: tuple[float, ...] = (
        5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200, 43200, 43200, 43200, 43200,
    )
    webhook_timeout: float = 15.0
    webhook_secret_overlap: float = 24 * 3600.0
    webhook_key_file: Path | None = None
    # The background work includes the webhook deliverer; off, it is left to a
    # separate `kandev-es webhook deliver`.
    webhooks_in_process: bool = True

    @property
    def backend(self) -> str:
        return "postgres" if self.database_url else "sqlite"

    @property
    def allowed_repository_roots(self) -> tuple[Path, ...]:
        roots = self.repository_roots or (self.data_dir / "repos",)
        return tuple(root.expanduser().resolve() for root in roots)

    @property
    def ledger_key_path(self) -> Path:
        return self.ledger_key_file or self.data_dir / "ledger.key"

    @property
    def webhook_key_path(self) -> Path:
        return self.webhook_key_file or self.data_dir / "webhook.key"

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "kandev.sqlite3"

    @cached_property
    def postgres(self) -> PostgresTarget | None:
        """Where every PostgreSQL connection goes (None on SQLite); raises
        ``InvalidSetting`` for a URL the service cannot honour."""
        if not self.database_url:
            return None
        return postgres_target(self.database_url, self.pg_connect_timeout)

    @property
    def location(self) -> str:
        """Where the storage lives, safe to print: the SQLite file, or the
        PostgreSQL URL with its password masked."""
        if self.database_url:
            return redact_url(self.database_url)
        return str(self.sqlite_path.resolve())

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "y", "on"}


LOG_FORMATS = ("text", "json")
TRACE_EXPORTERS = ("otlp", "console")


BACKGROUND_LAYOUTS = ("process", "threads", "external")


def _background(env: Mapping[str, str]) -> dict[str, Any]:
    """Where the background work runs, and whether it includes the Runtime
    (the webhook deliverer's switch is with the webhook settings)."""
    value = (env.get("KANDEV_BACKGROUND") or "").strip().lower()
    if value and value not in BACKGROUND_LAYOUTS:
        raise InvalidSetting(
            f"KANDEV_BACKGROUND must be process, threads or external, got {_shown(value)}"
        )
    return {
        "background": value,
        "runtime_in_process": _flag(env.get("KANDEV_RUNTIME_IN_PROCESS"), True),
    }


def _log_format(env: Mapping[str, str]) -> str:
    value = (env.get("KANDEV_LOG_FORMAT") or "text").strip().lower()
    if value not in LOG_FORMATS:
        raise InvalidSetting(f"KANDEV_LOG_FORMAT must be text or json, got {_shown(value)}")
    return value


def _tracing(env: Mapping[str, str]) -> dict[str, Any]:
    """Traces are on when OTEL_TRACES_EXPORTER names an exporter (otlp, console)
    or an OTLP endpoint is set, unless OTEL_SDK_DISABLED or
    OTEL_TRACES_EXPORTER=none. Only OTLP over HTTP (protobuf) is shipped."""
    exporter = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if _flag(env.get("OTEL_SDK_DISABLED"), False) or exporter == "none":
        return {"tracing": False}
    if exporter and exporter not in TRACE_EXPORTERS:
        raise InvalidSetting(
            f"OTEL_TRACES_EXPORTER must be otlp, console or none, got {_shown(exporter)}"
        )
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if (exporter or "otlp") == "otlp" and protocol != "http/protobuf":
        raise InvalidSetting(
            f"OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf, got {_shown(protocol)}"
        )
    return {"tracing": bool(exporter or endpoint), "trace_exporter": exporter or "otlp"}


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or a ``password=`` query
    parameter) replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{hostport}"
    query = urlencode(
        [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="*"
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


URL_SETTING = "KANDEV_DATABASE_URL"
# Values of target_session_attrs that would send the service's writes to a standby.
_READ_ONLY_TARGETS = ("read-only", "standby", "prefer-standby")


@dataclass(frozen=True)
class PostgresTarget:
    """One libpq conninfo, derived once from the database URL, that every
    PostgreSQL connection of the service uses: the event store's pool, the
    read-model pool, LISTEN, the projection leader's lock, the CLI. Both
    multi-host spellings (``h1:P1,h2:P2`` and ``?host=h1,h2&port=P1,P2``) and
    every libpq parameter (``target_session_attrs``, ``connect_timeout``,
    ``sslmode``, ...) come through unchanged. Our own ``schema`` parameter is
    not libpq's: the read models' pool puts it on its ``search_path``
    (``schema_conninfo``); the event store names the schema in its SQL."""

    params: tuple[tuple[str, str], ...]
    schema: str | None

    @property
    def conninfo(self) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo("", **dict(self.params))

    @property
    def schema_conninfo(self) -> str:
        """``conninfo`` with the schema first on the ``search_path``, added to
        the URL's own ``options`` if it has some."""
        if not self.schema:
            return self.conninfo
        from psycopg.conninfo import make_conninfo

        params = dict(self.params)
        escaped = self.schema.replace("\\", "\\\\").replace(" ", "\\ ")
        search_path = f"-c search_path={escaped}"
        options = params.get("options")
        params["options"] = f"{options} {search_path}" if options else search_path
        return make_conninfo("", **params)

    def as_dict(self) -> dict[str, str]:
        return dict(self.params)


def _split_schema(query: str) -> tuple[str, list[str]]:
    """The query without our ``schema`` parameter (libpq rejects it), and its values."""
    kept, schemas = [], []
    for piece in query.split("&"):
        if not piece:
            continue
        key, _, value = piece.partition("=")
        if unquote(key) == "schema":
            schemas.append(unquote(value))
        else:
            kept.append(piece)
    return "&".join(kept), schemas


def _check_hosts(params: Mapping[str, str]) -> None:
    hosts = (params.get("host") or params.get("hostaddr") or "").split(",")
    if "port" not in params:
        return
    ports = params["port"].split(",")
    if len(ports) not in (1, len(hosts)):
        raise InvalidSetting(
            f"{URL_SETTING} names {len(hosts)} hosts but {len(ports)} ports"
        )
    for port in ports:
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise InvalidSetting(f"{URL_SETTING} has an invalid port {port!r}")


def postgres_target(url: str, connect_timeout: int = 1) -> PostgresTarget:
    """Parse ``url`` once, with libpq's own parser; ``InvalidSetting`` (one line,
    exit 2 from the CLI) for anything the service cannot honour, before any
    connection is tried. ``connect_timeout`` (seconds, at least libpq's 2) and,
    for a host list, ``target_session_attrs=read-write`` are added unless the
    URL sets them."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise InvalidSetting(f"{URL_SETTING} must be a postgresql:// URL, got {redact_url(url)!r}")
    query, schemas = _split_schema(parts.query)
    # Rebuilt by hand: urlunsplit drops the empty authority of postgresql:///db.
    libpq_url = url.partition("?")[0] + (f"?{query}" if query else "")
    if len(schemas) > 1 or (schemas and not schemas[0].strip()):
        raise InvalidSetting(f"{URL_SETTING} must name at most one non-empty schema")
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise InvalidSetting(
            f"{URL_SETTING} needs the postgres extra: pip install 'kandev-es[postgres]'"
        ) from None
    try:
        parsed = conninfo_to_dict(libpq_url)
    except psycopg.Error as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidSetting(f"{URL_SETTING} is not a URL libpq accepts: {reason}") from None
    params = {key: str(value) for key, value in parsed.items() if value is not None}
    _check_hosts(params)
    attrs = params.get("target_session_attrs")
    if attrs in _READ_ONLY_TARGETS:
        raise InvalidSetting(
            f"{URL_SETTING} has target_session_attrs={attrs}: the service writes, "
            "use read-write (or primary)"
        )
    if attrs is None and "," in (params.get("host") or params.get("hostaddr") or ""):
        params["target_session_attrs"] = "read-write"
    params.setdefault("connect_timeout", str(max(2, connect_timeout)))
    schema = schemas[0] if schemas else None
    return PostgresTarget(tuple(sorted(params.items())), schema)


def _raw(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


DAY, YEAR = 86_400, 366 * 86_400
# Every numeric setting and its bounds, inclusive: an integer's (low, high); a
# number of seconds' (low, high, low_excluded). A value outside them, nan, inf
# or no number at all is InvalidSetting (the CLI's one-line usage error, exit 2),
# never a traceback later (timedelta(seconds=nan) in the middle of a command).
INT_SETTINGS: dict[str, tuple[int, int]] = {
    "KANDEV_POOL_SIZE": (1, 1_000),
    "KANDEV_MAX_BODY_BYTES": (1, 1 << 30),
    "KANDEV_BATCH_MAX_ITEMS": (1, 100_000),
    "KANDEV_MAX_CONNECTIONS": (1, 1_000_000),
    "KANDEV_SEND_TIMEOUT": (1, 86_400),
    # Within waitress' 256 KiB for the request line and headers together.
    "KANDEV_MAX_REQUEST_LINE": (64, 262_144),
    "KANDEV_MAX_HEADER_FIELDS": (1, 10_000),
    "KANDEV_MAX_HEADER_FIELD_BYTES": (64, 262_144),
    "KANDEV_BODY_MEMORY_BYTES": (1_024, 1 << 30),
    "KANDEV_SNAPSHOT_CACHE_SIZE": (1, 10_000_000),
    "KANDEV_AGGREGATE_CACHE_SIZE": (1, 10_000_000),
    "KANDEV_PG_CONNECT_TIMEOUT": (1, 3_600),
    "KANDEV_MAX_STREAMS": (0, 4_096),
    "KANDEV_MAX_STREAMS_PER_TOKEN": (0, 4_096),
    "KANDEV_MAX_AGENTS_PER_RUN": (0, 10_000),
    "KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE": (0, 10_000),
    "KANDEV_STEP_ATTEMPTS": (1, 1_000),
    "KANDEV_RECOVERY_ATTEMPTS": (1, 1_000),
    "KANDEV_LEDGER_CHECKPOINT_EVENTS": (1, 10_000_000),
}
SECONDS_SETTINGS: dict[str, tuple[float, float, bool]] = {
    "KANDEV_HEADER_TIMEOUT": (0, DAY, True),
    "KANDEV_BODY_TIMEOUT": (0, DAY, True),
    "KANDEV_IDLE_TIMEOUT": (0, DAY, True),
    "KANDEV_PROJECTION_POLL_SECONDS": (0, 3_600, True),
    "KANDEV_LEASE_SECONDS": (0, DAY, True),
    "KANDEV_RUN_TOKEN_TTL": (0, YEAR, True),
    # 0: no backoff.
    "KANDEV_RECOVERY_BACKOFF_SECONDS": (0, DAY, False),
    # 0: a link that is expired at once (tests use it).
    "KANDEV_AUDIT_LINK_SECONDS": (0, YEAR, False),
    "KANDEV_LEDGER_CHECKPOINT_SECONDS": (0, DAY, True),
    "KANDEV_WEBHOOK_TIMEOUT": (0, 300, True),
    "KANDEV_WEBHOOK_SECRET_OVERLAP": (0, 30 * DAY, False),
}


def _shown(raw: str) -> str:
    """A bad value as the one-line error quotes it: at most 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    low, high = INT_SETTINGS[name]
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:  # also past Python's digit limit
        raise InvalidSetting(f"{name} must be an integer, got {_shown(raw)}") from None
    if not low <= value <= high:
        raise InvalidSetting(f"{name} must be an integer in [{low}, {high}], got {_shown(raw)}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    low, high, low_excluded = SECONDS_SETTINGS[name]
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidSetting(f"{name} must be a number, got {_shown(raw)}") from None
    above_low = value > low if low_excluded else value >= low
    if not (above_low and value <= high):  # also refuses nan and inf
        bounds = f"{'(' if low_excluded else '['}{low}, {high}]"
        raise InvalidSetting(f"{name} must be seconds in {bounds}, got {_shown(raw)}")
    return value


def _ledger_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The tamper-evident history's settings (docs/auditing.md)."""
    key_file = env.get("KANDEV_LEDGER_KEY_FILE")
    return {
        "ledger_checkpoint_seconds": _seconds(env, "KANDEV_LEDGER_CHECKPOINT_SECONDS", 2.0),
        "ledger_checkpoint_events": _int(env, "KANDEV_LEDGER_CHECKPOINT_EVENTS", 1000),
        "ledger_key_file": Path(key_file) if key_file else None,
        "ledger_origin": env.get("KANDEV_LEDGER_ORIGIN") or None,
        "ledger_save_chains": _flag(env.get("KANDEV_LEDGER_SAVE_CHAINS"), True),
        "seal_free_text": _flag(env.get("KANDEV_SEAL_FREE_TEXT"), True),
        "ledger_witness_urls": _witness_urls(env.get("KANDEV_LEDGER_WITNESS_URLS") or ""),
    }


def _retry_schedule(raw: str | None) -> tuple[float, ...]:
    """KANDEV_WEBHOOK_RETRY_SCHEDULE: seconds before each retry, comma-separated."""
    if raw is None or not raw.strip():
        return Settings.webhook_retry_schedule
    try:
        delays = tuple(float(part) for part in raw.split(","))
    except ValueError:
        delays = ()
    if not delays or len(delays) > 100 or not all(0 < d <= 7 * DAY for d in delays):
        raise InvalidSetting(
            "KANDEV_WEBHOOK_RETRY_SCHEDULE must be 1 to 100 comma-separated seconds in"
            f" (0, {7 * DAY}], got {_shown(raw)}"
        )
    return delays


def _webhook_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """Webhook subscriptions and their delivery (docs/webhooks.md)."""
    key_file = env.get("KANDEV_WEBHOOK_KEY_FILE")
    networks = env.get("KANDEV_WEBHOOK_ALLOW_NETWORKS") or ""
    return {
        "webhook_allow_http": _flag(env.get("KANDEV_WEBHOOK_ALLOW_HTTP"), False),
        "webhook_allow_networks": tuple(p.strip() for p in networks.split(",") if p.strip()),
        "webhook_retry_schedule": _retry_schedule(env.get("KANDEV_WEBHOOK_RETRY_SCHEDULE")),
        "webhook_timeout": _seconds(env, "KANDEV_WEBHOOK_TIMEOUT", 15.0),
        "webhook_secret_overlap": _seconds(env, "KANDEV_WEBHOOK_SECRET_OVERLAP", 24 * 3600.0),
        "webhook_key_file": Path(key_file) if key_file else None,
        "webhooks_in_process": _flag(env.get("KANDEV_WEBHOOKS_IN_PROCESS"), True),
    }


def _public_url(env: Mapping[str, str]) -> dict[str, Any]:
    given = env.get("KANDEV_PUBLIC_URL")
    return {"public_url": given or Settings.public_url, "public_url_given": bool(given)}


def _witness_urls(raw: str) -> tuple[str, ...]:
    urls = tuple(url.strip().rstrip("/") for url in raw.split(",") if url.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise InvalidSetting(f"KANDEV_LEDGER_WITNESS_URLS: {_shown(url)} is not an http(s) URL")
    if len(urls) > 15:
        raise InvalidSetting("KANDEV_LEDGER_WITNESS_URLS: at most 15 witnesses (a note holds 16"
                             " signatures)")
    return urls


def _connection_bounds(env: Mapping[str, str]) -> dict[str, Any]:
    """The HTTP worker's times and connection count (docs/security.md)."""
    return {
        "header_timeout": _seconds(env, "KANDEV_HEADER_TIMEOUT", 10.0),
        "body_timeout": _seconds(env, "KANDEV_BODY_TIMEOUT", 30.0),
        "idle_timeout": _seconds(env, "KANDEV_IDLE_TIMEOUT", 5.0),
        "send_timeout": _int(env, "KANDEV_SEND_TIMEOUT", Settings.send_timeout),
        "max_connections": _int(env, "KANDEV_MAX_CONNECTIONS", 2048),
    }


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    step_attempts = _int(env, "KANDEV_STEP_ATTEMPTS", Settings.step_attempts)
    recovery_attempts = _int(env, "KANDEV_RECOVERY_ATTEMPTS", Settings.recovery_attempts)
    backoff = _seconds(env, "KANDEV_RECOVERY_BACKOFF_SECONDS", Settings.recovery_backoff_seconds)
    settings = Settings(
        step_attempts=step_attempts,
        recovery_attempts=recovery_attempts,
        recovery_backoff_seconds=backoff,
        data_dir=Path(env.get("KANDEV_DATA_DIR") or ".kandev-es"),
        database_url=env.get("KANDEV_DATABASE_URL") or None,
        create_tables=_flag(env.get("KANDEV_CREATE_TABLES"), True),
        pool_size=_int(env, "KANDEV_POOL_SIZE", 5),
        max_body_bytes=_int(env, "KANDEV_MAX_BODY_BYTES", 1_048_576),
        batch_max_items=_int(env, "KANDEV_BATCH_MAX_ITEMS", 1_000),
        **_connection_bounds(env),
        max_request_line=_int(env, "KANDEV_MAX_REQUEST_LINE", Settings.max_request_line),
        max_header_fields=_int(env, "KANDEV_MAX_HEADER_FIELDS", Settings.max_header_fields),
        max_header_field_bytes=_int(
            env, "KANDEV_MAX_HEADER_FIELD_BYTES", Settings.max_header_field_bytes
        ),
        body_memory_bytes=_int(env, "KANDEV_BODY_MEMORY_BYTES", Settings.body_memory_bytes),
        snapshot_cache_size=_int(env, "KANDEV_SNAPSHOT_CACHE_SIZE", Settings.snapshot_cache_size),
        aggregate_cache_size=_int(
            env, "KANDEV_AGGREGATE_CACHE_SIZE", Settings.aggregate_cache_size
        ),
        projection_poll_seconds=_seconds(env, "KANDEV_PROJECTION_POLL_SECONDS", 0.2),
        log_level=env.get("KANDEV_LOG_LEVEL") or None,
        lease_seconds=_seconds(env, "KANDEV_LEASE_SECONDS", 30.0),
        agent_command=env.get("KANDEV_AGENT_COMMAND") or Settings.agent_command,
        **_public_url(env),
        # http/gunicorn.conf.py binds to KANDEV_BIND (default 127.0.0.1:8000).
        agent_api_url=bind_url(env.get("KANDEV_BIND") or "127.0.0.1:8000"),
        failpoint=env.get("KANDEV_FAILPOINT") or None,
        **_background(env),
        pg_pre_ping="y" if _flag(env.get("KANDEV_PG_PRE_PING"), False) else "n",
        pg_connect_timeout=_int(env, "KANDEV_PG_CONNECT_TIMEOUT", 1),
        max_streams=_int(env, "KANDEV_MAX_STREAMS", 32),
        repository_roots=tuple(
            Path(part) for part in (env.get("KANDEV_REPOSITORY_ROOTS") or "").split(":") if part
        ),
        max_streams_per_token=_int(env, "KANDEV_MAX_STREAMS_PER_TOKEN", 8),
        run_token_ttl=_seconds(env, "KANDEV_RUN_TOKEN_TTL", 24 * 3600.0),
        audit_link_seconds=_seconds(env, "KANDEV_AUDIT_LINK_SECONDS", 900.0),
        max_agents_per_run=_int(env, "KANDEV_MAX_AGENTS_PER_RUN", 4),
        max_run_agents_per_workspace=_int(env, "KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE", 16),
        **_ledger_settings(env),
        **_webhook_settings(env),
        api_docs=_flag(env.get("KANDEV_API_DOCS"), True),
        agent_env=tuple(
            name.strip() for name in (env.get("KANDEV_AGENT_ENV") or "").split(",") if name.strip()
        ),
        log_format=_log_format(env),
        **_tracing(env),
    )
    settings.postgres  # noqa: B018 -- a URL it cannot honour fails here, before any connection
    return settings


# What every agent gets from the server's environment; everything else is left
# behind (database URLs, tokens, whatever secret the server was started with).
_AGENT_BASE_NAMES = ("PATH", "HOME", "LANG", "TZ")
# The bundled demo agent's one knob; not a secret.
_AGENT_KANDEV_NAMES = ("KANDEV_DEMO_AGENT_SECONDS",)


def agent_environment(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment an agent starts from, by allowlist: PATH, HOME, LANG,
    LC_*, TZ and the names listed in KANDEV_AGENT_ENV. KANDEV_* names (the
    database URL, tokens, failpoints) are never passed even if listed; the
    launch adds the run's own variables."""
    env = os.environ if environ is None else environ
    allowed = set(_AGENT_BASE_NAMES) | set(_AGENT_KANDEV_NAMES)
    allowed |= {name for name in settings.agent_env if not name.startswith("KANDEV_")}
    return {
        name: value
        for name, value in env.items()
        if name in allowed or (name.startswith("LC_") and name.isidentifier())
    }


# A PostgreSQL password libpq would use: never handed to a child process.
_LIBPQ_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE"})


def git_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git commands get, and with them the hooks of a
    registered repository (``post-checkout``): the server's, without its own
    settings (KANDEV_*: the database URL, tokens, key files, failpoints) or a
    libpq password. Git itself needs the rest (PATH, HOME, GIT_*, SSH_*)."""
    env = os.environ if environ is None else environ
    return {
        name: value
        for name, value in env.items()
        if not name.startswith("KANDEV_") and name not in _LIBPQ_SECRETS
    }


def take_mcp_token(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The bearer token ``kandev-es mcp`` acts with over stdio (``KANDEV_TOKEN``).
    Removed from the environment once read, so the processes the server starts
    (agents get their own run token) never inherit the caller's credential."""
    env = os.environ if environ is None else environ
    return env.pop("KANDEV_TOKEN", None) or None


SERVED_URL_FILE = "served-url"


def served_url_file(settings: Settings) -> Path:
    """Where `serve` records the address it listens on, for the commands run
    beside it on the same data dir (the audit link of `identity history`)."""
    return Path(settings.data_dir) / SERVED_URL_FILE


def audit_base_url(settings: Settings) -> str:
    """The base of the auditor's-page links the CLI prints: KANDEV_PUBLIC_URL when
    set (behind a proxy, another host); else where this data dir's `serve`
    listens, as it recorded at start (`serve --port 8123`); else the default."""
    if not settings.public_url_given:
        try:
            recorded = served_url_file(settings).read_text(encoding="utf-8").strip()
        except OSError:
            recorded = ""
        if recorded.startswith(("http://", "https://")):
            return recorded
    return settings.public_url


def local_url(host: str, port: int) -> str:
    """The URL a process on this host reaches a server listening on ``host``
    and ``port`` at: a wildcard address is reached on loopback."""
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind_url(bind: str) -> str | None:
    """``local_url`` of a gunicorn bind (``HOST:PORT``, ``[V6]:PORT``, ``HOST``
    for port 8000); None for ``unix:PATH`` and ``fd://N``, which agents cannot
    reach over TCP."""
    if bind.startswith(("unix:", "fd://")):
        return None
    host, colon, port = bind.rpartition(":")
    if not colon or not port.isdigit() or (host.count(":") and not host.endswith("]")):
        host, port = bind, "8000"  # no port given (a bare IPv6 address included)
    return local_url(host, int(port))


def data_path(settings: Settings, *parts: str) -> Path:
    """A path under the data dir (worktrees, blobs, agent logs), made absolute so
    subprocesses with another cwd agree on it."""
    return settings.data_dir.resolve().joinpath(*parts)


# prometheus_client's multiprocess mode reads this name when it is first imported.
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def metrics_dir(settings: Settings) -> Path:
    """Where a server's worker processes keep their metric values (one run's worth:
    the server wipes it at start)."""
    return data_path(settings, "metrics")


def multiprocess_metrics_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory the running server's workers share their metrics through,
    or None outside a multi-process server (one process answers for itself)."""
    env = os.environ if environ is None else environ
    raw = env.get(METRICS_DIR_VARIABLE)
    return Path(raw) if raw else None


def export_multiprocess_metrics_dir(
    directory: Path, environ: MutableMapping[str, str] | None = None
) -> None:
    """Name ``directory`` to this process and the workers it will fork (the
    gunicorn master's on_starting, before any worker forks: metrics.start_multiprocess)."""
    env = os.environ if environ is None else environ
    env[METRICS_DIR_VARIABLE] = str(directory)


CLIENT_TOKEN_VARIABLE = "KANDEV_TOKEN"


def client_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token a CLI command that talks to a server over HTTP sends
    (``task import --url``): from the environment only, never a flag."""
    env = os.environ if environ is None else environ
    return env.get(CLIENT_TOKEN_VARIABLE) or None


RUN_CREDENTIAL_VARIABLES = ("KANDEV_API_URL", "KANDEV_RUN_TOKEN", "KANDEV_RUN_ID")


@dataclass(frozen=True)
class RunCredential:
    """What an agent launch hands its process: where the API is, the run token
    and the run id it is bound to (read by ``kandev-es agentctl``)."""

    api_url: str
    token: str
    run_id: str
    # The launching step's span (W3C TRACEPARENT, when traces are on): the
    # agent's creates join the trace of the create that started it.
    traceparent: str | None = None


def load_run_credential(environ: Mapping[str, str] | None = None) -> RunCredential:
    env = os.environ if environ is None else environ
    missing = [name for name in RUN_CREDENTIAL_VARIABLES if not env.get(name)]
    if missing:
        raise LookupError(
            f"missing {', '.join(missing)}: agentctl runs inside an agent launched by "
            "kandev-es, which sets KANDEV_API_URL, KANDEV_RUN_TOKEN and KANDEV_RUN_ID"
        )
    return RunCredential(
        env["KANDEV_API_URL"],
        env["KANDEV_RUN_TOKEN"],
        env["KANDEV_RUN_ID"],
        env.get("TRACEPARENT") or None,
    )
