"""The command line of scripts/bench: its options, the order of the
measurements, and the one JSON report printed on stdout."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg

from benchlib.bulk import bulk_cost
from benchlib.chains import chains_cost
from benchlib.common import load_average, say
from benchlib.database import database, durability, with_schema
from benchlib.erasure import erasure_cost
from benchlib.fanout import CONSUMERS, fanout_cost, fanout_targets
from benchlib.in_process import in_process, transactions
from benchlib.over_http import served
from benchlib.rebuild import rebuild_rate
from benchlib.recovery import recovery
from benchlib.saves import store_saves
from benchlib.scaling import scaling
from benchlib.targets import chains_targets, erasure_targets, scaling_targets, targets
from benchlib.tracing import tracing_cost
from benchlib.webhooks import webhooks_cost
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings, postgres_target

DESCRIPTION = "Benchmark kandev-es on PostgreSQL; print ONE JSON object on stdout."


def counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {number}")
    return number


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="fewer samples, fewer workers")
    parser.add_argument("--workers", type=int, default=None, help="gunicorn workers")
    parser.add_argument("--clients", type=int, default=None, help="HTTP client threads")
    parser.add_argument("--scaling", action="store_true",
                        help="add the 'scaling' section: kandev-es vs the CRUD peer")
    parser.add_argument("--scaling-only", action="store_true",
                        help="measure only the 'scaling' section")
    parser.add_argument("--scaling-clients", type=counts, default=[1, 16, 64],
                        help="HTTP client counts for 'scaling' (default 1,16,64)")
    parser.add_argument("--cost-clients", type=counts, default=[16, 64],
                        help="client counts for the cost_per_created/found tables in"
                        " 'scaling' (default 16,64; 0 = none)")
    parser.add_argument("--cost-settle", type=float, default=11.0,
                        help="seconds before and after each cost load for PostgreSQL's"
                        " counters to be flushed (default 11)")
    parser.add_argument("--save-clients", type=counts, default=[1, 8, 32],
                        help="client counts for store saves in 'scaling' (default 1,8,32)")
    parser.add_argument("--tracing-only", action="store_true",
                        help="measure only the 'tracing' section: creates over HTTP with"
                        " traces off and on (docs/observability.md: Cost)")
    parser.add_argument("--before", type=Path, default=None,
                        help="with --tracing-only: an earlier checkout (its .venv and"
                        " http/gunicorn.conf.py) measured as a third variant, traces off")
    parser.add_argument("--chains-only", action="store_true",
                        help="measure only the 'chains' section: saves and Created over HTTP"
                        " with hash chains and without (docs/auditing.md: Cost)")
    parser.add_argument("--erasure-only", action="store_true",
                        help="measure only the 'erasure' section: Created over HTTP with free"
                        " text sealed and in cleartext, and forgetting a task of 100 events"
                        " (docs/auditing.md: Erasure)")
    parser.add_argument("--erasure-a-a", action="store_true",
                        help="with --erasure-only: the Created comparison again with both"
                        " sides sealed (its ratio should be 1: the method's own spread)")
    parser.add_argument("--webhooks-only", action="store_true",
                        help="measure only the 'webhooks' section: Created over HTTP with no"
                        " webhook subscription and with one to a fast local receiver (its"
                        " lag and what it costs; docs/webhooks.md)")
    parser.add_argument("--fanout-only", action="store_true",
                        help="measure only the 'fanout' section: Created over HTTP with 0, 1,"
                        " 10 and 50 SSE consumers of the feed (docs/benchmarks.md)")
    parser.add_argument("--fanout-consumers", type=counts, default=list(CONSUMERS),
                        help="consumer counts for 'fanout' (default 0,1,10,50; 0 first)")
    parser.add_argument("--fanout-apart", action="store_true",
                        help="'fanout' also measures what each count's streams cost a"
                        " streaming server of their own, creates made on another at 60/s")
    parser.add_argument("--bulk-only", action="store_true",
                        help="measure only the 'bulk' section: a backlog imported by one client"
                        " through the batch route, vs single creates and the CRUD peer's"
                        " single and batch routes (docs/benchmarks.md)")
    parser.add_argument("--bulk-items", type=positive, default=10_000,
                        help="items of the 'bulk' section's backlog (default 10,000)")
    parser.add_argument("--rounds", type=positive, default=1,
                        help="rounds of the HTTP measurement in 'scaling', the two servers"
                        " alternating which goes first; figures are medians (default 1;"
                        " the targets are checked with 3)")
    return parser


def main() -> int:
    """Measure what ``args`` ask on a throwaway schema, print the report; 1 when
    the storm made more than one task (a --scaling-only run has no storm)."""
    args = arguments().parse_args()
    args.workers = args.workers or (2 if args.quick else 4)
    args.clients = args.clients or (8 if args.quick else 16)
    tmp = Path(tempfile.mkdtemp(prefix="kandev-bench-"))
    report: dict[str, Any] = {
        "seconds_per_measurement": args.seconds, "quick": args.quick,
        "load_before": load_average(),  # the machine's, 1/5/15 min, before anything starts
    }
    try:
        with database(tmp) as admin_url:
            on_schema(report, args, admin_url, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.chains_only:
        report["targets"] = chains_targets(report["chains"])
    if args.fanout_only:
        report["targets"] = fanout_targets(report["fanout"])
    if args.erasure_only:
        report["targets"] = erasure_targets(report["erasure"])
    if (args.scaling_only or args.tracing_only or args.chains_only or args.webhooks_only
            or args.fanout_only or args.bulk_only or args.erasure_only):
        print(json.dumps(report, indent=2))
        return 0
    report["targets"] = targets(report)
    print(json.dumps(report, indent=2))
    return 0 if report["storm"]["met"] else 1


def on_schema(report: dict[str, Any], args: argparse.Namespace, admin_url: str,
              tmp: Path) -> None:
    """The measurements, on a fresh schema of ``admin_url`` dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    url = with_schema(admin_url, schema)
    settings = Settings(data_dir=tmp / "data", database_url=url)
    services = bootstrap(settings)  # creates the schema and tables
    report["database"] = durability(admin_url)
    try:
        if args.tracing_only:
            report["tracing"] = tracing_cost(services, url, tmp, args.workers, args.clients,
                                             args.seconds, args.rounds, args.before)
            return
        if args.chains_only:
            report["chains"] = chains(args, settings, admin_url, url, tmp, services)
            return
        if args.erasure_only:
            report["erasure"] = erasure_cost(url, tmp, services, args.workers, args.clients,
                                             args.seconds, args.rounds, admin_url,
                                             a_a=args.erasure_a_a)
            return
        if args.bulk_only:
            report["bulk"] = bulk_cost(services, admin_url, url, schema, tmp, args.workers,
                                       args.seconds, args.rounds, args.bulk_items)
            return
        if args.webhooks_only:
            report["webhooks"] = webhooks_cost(services, url, tmp, args.workers, args.clients,
                                               args.seconds, args.rounds)
            return
        if args.fanout_only:
            counts = tuple(dict.fromkeys([0, *args.fanout_consumers]))
            report["fanout"] = fanout_cost(url, tmp, services, args.workers, args.clients,
                                           args.seconds, args.rounds, admin_url, counts=counts,
                                           apart=args.fanout_apart)
            return
        if args.scaling or args.scaling_only:
            report["scaling"] = scaling(
                settings, admin_url, url, schema, tmp, services, args.workers,
                args.scaling_clients, args.seconds,
                [c for c in args.cost_clients if c > 0], args.cost_settle, args.rounds,
            )
            report["scaling"]["store_saves"] = store_saves(
                settings, admin_url, args.save_clients, args.seconds
            )
        if args.scaling_only:
            report["scaling"]["targets"] = scaling_targets(report["scaling"])
        else:
            full_run(report, args, settings, admin_url, url, schema, tmp, services)
    finally:
        services.close()
        with contextlib.suppress(psycopg.Error), psycopg.connect(
            postgres_target(admin_url).conninfo, autocommit=True
        ) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def chains(args: argparse.Namespace, settings: Settings, admin_url: str, url: str, tmp: Path,
           services: Services, initialised: bool = False) -> dict[str, Any]:
    """The 'chains' section (benchlib/chains.py): saves at --save-clients, Created
    over HTTP at --clients on --workers, --rounds alternating rounds."""
    return chains_cost(settings, admin_url, url, tmp, services, args.save_clients,
                       args.workers, args.clients, args.seconds, args.rounds, initialised)


def full_run(
    report: dict[str, Any], args: argparse.Namespace, settings: Settings, admin_url: str,
    url: str, schema: str, tmp: Path, services: Services,
) -> None:
    """Everything but the scaling section: in-process, transactions, HTTP,
    storm, projection lag, chains, rebuild, recovery."""
    samples = 20 if args.quick else 200
    say("in-process found/created vs raw SELECT/INSERT")
    report["in_process"] = in_process(services, url, schema, args.seconds)
    if "scaling" in report:
        report["scaling"]["targets"] = scaling_targets(report["scaling"], report["in_process"])
    say("commits per creation")
    report["transactions"] = transactions(settings, samples)
    report.update(served(settings, url, schema, tmp, services, args.seconds, args.workers,
                         args.clients, samples))
    report["chains"] = chains(args, settings, admin_url, url, tmp, services, initialised=True)
    say("rebuild")
    report["rebuild"] = rebuild_rate(services)
    say("recovery after SIGKILL")
    report["recovery"] = recovery(url, tmp, services)
