"""Store saves (the scaling section's store_saves): the store's one-statement
save of a 6-event stream against a raw 6-row INSERT transaction.

The saved events have a topic no kandev-es version knows ("bench:Saved"), so
they go to a schema of their own, dropped afterwards: in the run's store the
projection loop would stop before the first of them and the rebuild
measurement would refuse to swap (unknown topic), as they must for a real
newer writer's event."""

from __future__ import annotations

import contextlib
import os
import statistics
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from benchlib.common import concurrent_count, concurrent_rate, load_average, ratio, say
from benchlib.cpu import PostgresSide, cpu_delta, own_cpu_ns
from benchlib.database import connect, with_schema
from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings, postgres_target

RAW_EVENTS_DDL = (
    "CREATE TABLE raw_events (notification_id bigserial UNIQUE, originator_id uuid NOT NULL,"
    " originator_version bigint NOT NULL, topic text NOT NULL, state bytea NOT NULL,"
    " transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),"
    " PRIMARY KEY (originator_id, originator_version))"
)


RAW_EVENTS_INSERT = (
    "INSERT INTO raw_events (originator_id, originator_version, topic, state)"
    " SELECT * FROM unnest(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[])"
)


SAVE_ROWS = 6  # events in one save, as in the pgbench comparison


SAVE_STATE = os.urandom(240)


def save_params() -> tuple[list[uuid.UUID], list[int], list[str], list[bytes]]:
    stream = uuid.uuid4()
    versions = list(range(1, SAVE_ROWS + 1))
    return [stream] * SAVE_ROWS, versions, ["bench:Saved"] * SAVE_ROWS, [SAVE_STATE] * SAVE_ROWS


@contextlib.contextmanager
def saves_schema(settings: Settings, admin_url: str) -> Iterator[tuple[Settings, str, str]]:
    """(settings, url, schema) of a fresh schema of ``admin_url`` with the
    store's tables, dropped afterwards: the run's own store never holds the
    bench's synthetic events."""
    schema = f"bench_saves_{uuid.uuid4().hex[:12]}"
    url = with_schema(admin_url, schema)
    saves_settings = settings.with_overrides(database_url=url,
                                             data_dir=settings.data_dir / "saves")
    bootstrap(saves_settings).close()  # creates the schema and the store's tables
    try:
        yield saves_settings, url, schema
    finally:
        with contextlib.suppress(psycopg.Error), psycopg.connect(
            postgres_target(admin_url).conninfo, autocommit=True
        ) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def store_saves(
    settings: Settings, admin_url: str, client_counts: list[int], seconds: float
) -> list[dict[str, Any]]:
    """The store's save against a raw INSERT transaction (see measure_saves)."""
    with saves_schema(settings, admin_url) as (saves_settings, url, schema):
        return measure_saves(saves_settings, url, schema, client_counts, seconds)


def saver(recorder: Any) -> Callable[[], Callable[[], None]]:
    """A client's call: ``recorder.insert_events`` of a fresh 6-event stream."""
    from eventsourcing.persistence import StoredEvent

    def save() -> Callable[[], None]:
        def run() -> None:
            ids, versions, topics, states = save_params()
            recorder.insert_events([
                StoredEvent(originator_id=i, originator_version=v, topic=t, state=st)
                for i, v, t, st in zip(ids, versions, topics, states, strict=True)
            ])

        return run

    return save


def chained_saves(
    settings: Settings, admin_url: str, client_counts: list[int], seconds: float,
    rounds: int,
) -> list[dict[str, Any]]:
    """The store's save with hash chains (the default) against the same save
    with KANDEV_LEDGER_SAVE_CHAINS off (no chain hash written), on one fresh
    schema, at each client count: ``rounds`` rounds alternating which goes
    first, the ratio the median of the rounds' ratios."""
    with saves_schema(settings, admin_url) as (saves_settings, _, _):
        pool = max(5, max(client_counts) // 2 + 1)
        stores = {
            "with": bootstrap(saves_settings.with_overrides(create_tables=False, pool_size=pool)),
            "without": bootstrap(saves_settings.with_overrides(
                create_tables=False, pool_size=pool, ledger_save_chains=False)),
        }
        try:
            for services in stores.values():  # each pool opened and each statement prepared
                concurrent_rate(saver(services.app.recorder), max(client_counts),
                                min(seconds, 1.0))
            postgres = PostgresSide(admin_url)
            return [_chained_row(stores, postgres, clients, seconds, rounds)
                    for clients in client_counts]
        finally:
            for services in stores.values():
                services.close()


def _chained_row(stores: dict[str, Any], postgres: PostgresSide, clients: int,
                 seconds: float, rounds: int) -> dict[str, Any]:
    runs = []
    for number in range(rounds):
        order = ["with", "without"] if number % 2 == 0 else ["without", "with"]
        run: dict[str, Any] = {"order": order, "load": load_average()}
        for side in order:
            run[side] = _saves_and_cpu(stores[side].app.recorder, postgres, clients, seconds)
        runs.append(run)

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in runs), 1)

    row = {
        "clients": clients,
        "with_chains_per_s": median("with", "saves_per_s"),
        "without_chains_per_s": median("without", "saves_per_s"),
        "ratio": round(statistics.median(
            ratio(r["with"]["saves_per_s"], r["without"]["saves_per_s"]) for r in runs), 3),
        "cpu_us_per_save": {side: median(side, "cpu_us_per_save") for side in ("with", "without")},
        # the savers' process (its client threads: one interpreter lock) and PostgreSQL's
        "savers_cpu_us_per_save": {side: median(side, "savers_cpu_us_per_save")
                                   for side in ("with", "without")},
        "postgres_cpu_us_per_save": {side: median(side, "postgres_cpu_us_per_save")
                                     for side in ("with", "without")},
        # without / with CPU per save: the rate ratio of a machine the saves saturate,
        # steadier than the rates on one busy with other work
        "cpu_ratio": round(statistics.median(
            ratio(r["without"]["cpu_us_per_save"], r["with"]["cpu_us_per_save"])
            for r in runs), 3),
        "rounds": runs,
    }
    say(f"saves {clients:>3} clients: with chains {row['ratio']}x without")
    return row


def _saves_and_cpu(recorder: Any, postgres: PostgresSide, clients: int,
                   seconds: float) -> dict[str, float]:
    """Saves/s and the CPU µs per save of this process (the savers) and of
    PostgreSQL (0 for PostgreSQL when it is not on this machine)."""
    cpu: dict[str, Any] = {}

    def read(key: str) -> None:
        cpu[key] = (own_cpu_ns(), postgres.cpu() or {})

    count, elapsed = concurrent_count(saver(recorder), clients, seconds,
                                      started_hook=lambda: read("before"),
                                      stopped_hook=lambda: read("after"))
    savers = cpu["after"][0] - cpu["before"][0]
    database = cpu_delta(cpu["before"][1], cpu["after"][1])

    def per_save(ns: int) -> float:
        return round(ns / 1e3 / max(count, 1), 1)

    return {"saves_per_s": round(count / elapsed, 1),
            "cpu_us_per_save": per_save(savers + database),
            "savers_cpu_us_per_save": per_save(savers),
            "postgres_cpu_us_per_save": per_save(database)}


def measure_saves(
    settings: Settings, url: str, schema: str, client_counts: list[int], seconds: float
) -> list[dict[str, Any]]:
    """The store's save (recorder.insert_events: one call of kandev_insert_events)
    of a fresh 6-event stream, against BEGIN; one 6-row INSERT; COMMIT into a
    table shaped like the events table, at each client count. One process, a
    thread per client, each with its own connection (the store's pool is sized
    for the largest count)."""
    with connect(url, schema) as conn:
        conn.execute(RAW_EVENTS_DDL)
    biggest = max(client_counts)
    services = bootstrap(settings.with_overrides(create_tables=False,
                                                 pool_size=max(5, biggest // 2 + 1)))
    connections: list[psycopg.Connection[Any]] = []
    rows: list[dict[str, Any]] = []
    try:
        save = saver(services.app.recorder)

        def raw() -> Callable[[], None]:
            conn = connect(url, schema)
            connections.append(conn)

            def run() -> None:
                with conn.transaction():
                    conn.execute(RAW_EVENTS_INSERT, save_params())

            return run

        for clients in client_counts:
            saves = concurrent_rate(save, clients, seconds)
            raws = concurrent_rate(raw, clients, seconds)
            rows.append({
                "clients": clients,
                "saves_per_s": round(saves, 1),
                "raw_insert_tx_per_s": round(raws, 1),
                "ratio": ratio(saves, raws),
            })
            say(f"saves {clients:>3} clients: {rows[-1]['ratio']}x raw 6-row insert tx")
    finally:
        for conn in connections:
            conn.close()
        services.close()
    single = rows[0]["saves_per_s"] if rows else 0.0
    for row in rows:
        row["vs_one_client"] = ratio(row["saves_per_s"], single)
    return rows
