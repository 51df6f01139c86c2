"""Throughput and latency benchmark for AMQP 0-9-1 brokers: `warren bench` or
`python -m loadtest.bench`.

    python -m loadtest.bench --warren [--duration 10] [--scenarios a,b,...]
    python -m loadtest.bench --url amqp://guest:guest@127.0.0.1:5672/%2F
    python -m loadtest.bench --compare      # RabbitMQ (started for the occasion) vs Warren
    python -m loadtest.bench --warren --quick   # ~1 s per scenario, for CI
    python -m loadtest.bench --warren --external-client /opt/amqp-perf/amqp-perf

Every client (publisher or consumer) is its own process (multiprocessing, fork)
running the fast client of loadtest.fastclient on the project's codec: messages
are pre-encoded and sent in batches, deliveries parsed from the receive buffer,
so one client process moves well over 100k small messages/s. Each body starts
with the publish time (time.time_ns(), comparable across processes), from which
consumers measure end-to-end latency; publishers measure confirm latency.

To measure a sustainable rate rather than how fast a queue can grow, a
publisher pauses while more than --max-lag of its messages are not yet consumed
(shared counters; not in backlog-200k, which has no consumer while publishing).

With --external-client PATH an external load generator (amqp-perf) measures each
scenario instead (--client both: ours, then it, on the same broker); see
loadtest/external.py. Every row says which client measured it and reports consumed
against published (consumed_per_s, consumed_over_published).

Output: one JSON line per scenario on stdout as each finishes (progress goes to
stderr), then a table. With --compare also a comparison table and one JSON line
per scenario and client with Warren/RabbitMQ ratios, and a one-line-per-scenario
summary of those ratios.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
from typing import Any

from . import external
from .fastclient import DEFAULT_URL
from .output import (
    OWN_CLIENT,
    at_rate,
    comparison,
    format_comparison,
    format_ratios,
    format_table,
    log,
    print_json,
)
from .scenarios import SCENARIOS, run_scenario
from .targets import RabbitTarget, Target, WarrenTarget, rabbitmq_missing


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="warren bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios (amqp-perf's name of the closest one):\n" + "\n".join(
            f"  {k:20} {v} ({external.EXTERNAL_NAMES[k]})" for k, v in SCENARIOS.items())
        + "\n\nNAME@RATE in --scenarios runs NAME with its own --rate, so one run can hold "
          "a flood\nand a steady rate of the same scenario (transient-autoack,"
          "transient-autoack@10000).")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="AMQP URL of a running broker (default "
                       f"{DEFAULT_URL.replace('%', '%%')})")
    where.add_argument("--warren", action="store_true",
                       help="start a `warren serve` on a free port with a temp data dir")
    where.add_argument("--compare", action="store_true",
                       help="run against a private RabbitMQ node and a private Warren, "
                            "alternating, and print Warren/RabbitMQ ratios")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated scenarios, the bench's or amqp-perf's names, "
                             "each optionally NAME@RATE for its own --rate (default: all)")
    parser.add_argument("--external-client", metavar="PATH",
                        help="an external load generator (amqp-perf, built from its own "
                             "sources) to run for each scenario: PATH --url URL --scenario "
                             "NAME --seconds N --json [--rate R] [--pid PID]")
    parser.add_argument("--client", choices=["own", "external", "both"], default=None,
                        help="who measures: the bench's own client, the --external-client, or "
                             "both in turn on the same broker (default: external when "
                             "--external-client is given, else own)")
    parser.add_argument("--fresh-warren", action=argparse.BooleanOptionalAction, default=None,
                        help="a new private Warren for each scenario (default: yes when the "
                             "external client runs, else one Warren for the whole run)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of publishing per scenario (default 10)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke mode: 1 s per scenario, a 2,000-message backlog")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default=None,
                        help="x-queue-type of the durable queues (default: not set = classic)")
    parser.add_argument("--shards", type=int, default=None,
                        help="shards of the Warren started by --warren/--compare (default: CPUs)")
    parser.add_argument("--backlog", type=int, default=None,
                        help="messages of backlog-200k (default 200,000; --quick 2,000)")
    parser.add_argument("--confirm-window", type=int, default=1000,
                        help="outstanding confirms of persistent-confirm and backlog "
                             "(default 1000)")
    parser.add_argument("--prefetch", type=int, default=100,
                        help="prefetch of manual-ack consumers; they ack multiple every "
                             "prefetch/2 (default 100)")
    parser.add_argument("--batch", type=int, default=100,
                        help="messages per send of a publisher (default 100)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="messages/s of each publisher (default 0: as fast as it can; "
                             "not for backlog-200k). Latencies at a rate below saturation "
                             "show the broker's own latency rather than queueing")
    parser.add_argument("--max-lag", type=int, default=1000,
                        help="a publisher pauses while this many of its messages are not yet "
                             "consumed (default 1000; at saturation the end-to-end latency is "
                             "about max-lag / rate)")
    parser.add_argument("--max-lag-bytes", type=int, default=16 << 20,
                        help="...and while their bodies add up to more (default 16 MiB)")
    parser.add_argument("--drain-timeout", type=float, default=None,
                        help="seconds consumers may take after publishing stops "
                             "(default max(10, duration))")
    parser.add_argument("--backlog-timeout", type=float, default=None,
                        help="limit of each backlog phase (default 300 s; --quick 60 s)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="rounds of each scenario, alternating which broker goes first; "
                             "the summary gives each round's ratios and their median "
                             "(default 1). A steady rate's CPU follows how often the client "
                             "writes, which differs from run to run (docs/performance.md, reading a row)")
    parser.add_argument("--json-only", action="store_true", help="no table, only JSON lines")
    options = parser.parse_args(argv)
    if options.repeat < 1:
        parser.error("--repeat: at least 1")
    if options.quick:
        options.duration = min(options.duration, 1.0)
    options.backlog = options.backlog or (2_000 if options.quick else 200_000)
    options.drain_timeout = options.drain_timeout or max(10.0, options.duration)
    options.backlog_timeout = options.backlog_timeout or (60.0 if options.quick else 300.0)
    options.runs = {}  # what each scenario of the run is: its name and its publish rate
    for entry in (s.strip() for s in options.scenarios.split(",")):
        if entry:
            try:
                label, run = scenario_run(entry, options.rate)
            except ValueError as error:
                parser.error(str(error))
            options.runs.setdefault(label, run)
    options.scenario_list = list(options.runs)
    options.client = options.client or ("external" if options.external_client else "own")
    if options.client != "own":
        path = options.external_client
        if not path:
            parser.error(f"--client {options.client} needs --external-client PATH")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            parser.error(f"--external-client {path}: not an executable file (build amqp-perf "
                         "from its README)")
    options.clients = {"own": [OWN_CLIENT], "external": [external.client_label(
        options.external_client or "")], "both": [OWN_CLIENT, external.client_label(
            options.external_client or "")]}[options.client]
    if options.fresh_warren is None:
        options.fresh_warren = options.client != "own"
    return options


def scenario_run(entry: str, default_rate: float) -> tuple[str, tuple[str, float]]:
    """'NAME' or 'NAME@RATE' (either name of a scenario) -> its label in the run's rows,
    and (the bench's name of the scenario, the rate its publishers keep)."""
    given, at, rate_text = entry.partition("@")
    name = external.canonical(given)
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario: {given} (known: {', '.join(SCENARIOS)}; "
                         f"or amqp-perf's: {', '.join(external.ALIASES)})")
    if not at:
        return name, (name, default_rate)
    try:
        rate = float(rate_text)
    except ValueError:
        rate = 0.0
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"{entry}: the rate after @ is messages/s per publisher, above 0")
    if name == "backlog-200k":
        raise ValueError(f"{entry}: backlog-200k publishes as fast as it can (no rate)")
    return at_rate(name, rate), (name, rate)


def best_rabbit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The better RabbitMQ row of a scenario (classic vs quorum): by its sustained rate,
    the lesser of confirmed/s and consumed/s (a queue type that confirms faster than
    it delivers is only growing its queue), then by confirmed/s."""
    good = [r for r in rows if r["status"] == "ok"]
    if not good:
        return rows[0] if rows else None

    def sustained(row: dict[str, Any]) -> tuple[float, float]:
        confirmed = row.get("confirmed_per_s") or 0
        consumed = row.get("consumed_per_s")
        return (confirmed if consumed is None else min(confirmed, consumed), confirmed)
    return max(good, key=sustained)


def run_client(target: Target, label: str, client: str, options, run_id: str,
               both_queue_types: bool = False,
               round_: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One scenario of the run (its label in options.runs) measured by one client in
    one round (--repeat): its rows, and the one to compare. RabbitMQ's persistent-confirm runs with classic and
    quorum queues (both_queue_types) unless --queue-type says which, and the better one
    is compared."""
    name, rate = options.runs[label]
    options = copy.copy(options)
    options.rate = rate
    queue_types: list[str | None] = [options.queue_type]
    if both_queue_types and name == "persistent-confirm" and options.queue_type is None:
        queue_types = ["classic", "quorum"]
    rows = []
    for queue_type in queue_types:
        log(f"# {target.label}: {label}" + (f" ({queue_type})" if len(queue_types) > 1 else "")
            + f", measured by {client} ...")
        if client == OWN_CLIENT:
            row = run_scenario(target, name, options, run_id,
                               queue_type if len(queue_types) > 1 else "default")
        else:
            row = external.run(options.external_client, target, name, options, log=log,
                               queue_type=queue_type)
        row.update(scenario=label, rate=rate, round=round_)
        print_json(row)
        rows.append(row)
    return rows, (best_rabbit(rows) if len(rows) > 1 else rows[0])


def run_all(options, run_id: str, targets: list[Target], rows: list[dict[str, Any]],
            pairs: list[tuple[dict, dict]]) -> None:
    """Every scenario, on each broker (--compare: RabbitMQ and Warren, alternating which goes
    first), measured by each client in turn on the same broker, --repeat times. A Warren is
    started afresh for each scenario and round with --fresh-warren, else once."""
    rabbit = standing = None
    if options.compare:
        rabbit = RabbitTarget()
        targets.append(rabbit)
    if not (options.compare or options.warren):
        standing = Target(options.url or DEFAULT_URL)
        targets.append(standing)
    elif not options.fresh_warren:
        standing = WarrenTarget(options.shards)
        targets.append(standing)
    for index, label in enumerate(options.scenario_list):
        for round_ in range(1, options.repeat + 1):
            order = [rabbit, None] if rabbit is not None else [None]
            if (index + round_ - 1) % 2:
                order.reverse()
            compared: dict[tuple[str, str], dict[str, Any]] = {}
            for target in order:
                fresh = None
                if target is None:
                    if standing is None:
                        fresh = WarrenTarget(options.shards)
                        targets.append(fresh)
                    target = standing or fresh
                try:
                    for client in options.clients:
                        measured, chosen = run_client(target, label, client, options, run_id,
                                                      both_queue_types=target is rabbit,
                                                      round_=round_)
                        rows.extend(measured)
                        compared[(target.label, client)] = chosen
                finally:
                    if fresh is not None:
                        targets.remove(fresh)
                        fresh.stop()
            if rabbit is not None:
                for client in options.clients:
                    pair = (compared[("warren", client)], compared[("rabbitmq", client)])
                    pairs.append(pair)
                    print_json(comparison(*pair))


def table_order(rows: list[dict[str, Any]], options) -> list[dict[str, Any]]:
    """Rows by scenario, then round, then Warren before RabbitMQ, then client."""
    brokers = {"warren": 0, "rabbitmq": 1}
    return sorted(rows, key=lambda row: (options.scenario_list.index(row["scenario"]),
                                         row.get("round", 1), brokers.get(row["broker"], 2),
                                         options.clients.index(row["client"])))


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if options.compare and rabbitmq_missing():
        log(f"# {rabbitmq_missing()}")
        return 2
    run_id = f"{os.getpid():x}{int(time.time()) % 1_000_000:06d}"
    log(f"# warren bench: scenarios {','.join(options.scenario_list)}, duration "
        f"{options.duration:g} s, backlog {options.backlog:,}, measured by "
        f"{' and '.join(options.clients)}, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]} ({sys.executable})")
    targets: list[Target] = []
    rows: list[dict[str, Any]] = []
    pairs: list[tuple[dict, dict]] = []
    failed = False
    try:
        run_all(options, run_id, targets, rows, pairs)
    except KeyboardInterrupt:
        log("# interrupted")
        failed = True
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        log(f"# error: {error}")
        failed = True
    finally:
        for target in reversed(targets):
            try:
                target.stop()
            except Exception as error:  # noqa: BLE001
                log(f"# stopping {target.label}: {error}")
    if rows and not options.json_only:
        print()
        print(format_table(table_order(rows, options)))
        if pairs:
            print()
            print(format_comparison(pairs))
            print()
            print(format_ratios(pairs))
        sys.stdout.flush()
    if any(row["status"] == "error" for row in rows):
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
