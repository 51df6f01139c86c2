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
import os
import subprocess
import sys
import time
from typing import Any

from . import external
from .fastclient import DEFAULT_URL, AMQPError, ChannelClosed, ConnectionClosed, FastClient
from .output import (OWN_CLIENT, comparison, format_comparison, format_ratios,
                     format_table, log, print_json)
from .phases import run_phase, summarize
from .procs import process_tree, tree_memory
from .targets import RabbitTarget, Target, WarrenTarget, rabbitmq_missing

SCENARIOS: dict[str, str] = {
    "transient-autoack": "1 pub -> 1 con, 100 B, non-durable queue, no-ack consumer",
    "transient-ack": "1 -> 1, 100 B, non-durable, manual ack (prefetch, multiple every N)",
    "persistent-confirm": "1 -> 1, 100 B persistent, durable queue, confirm window 1000, ack",
    "confirm-each": "1 -> 1, 100 B persistent, durable queue, wait for each confirm, ack",
    "fanout-4x4": "4 pubs -> 4 queues -> 4 cons (one queue per pair), 100 B, no-ack",
    "large-64k": "1 -> 1, 64 KiB bodies, non-durable, no-ack",
    "backlog-200k": "200k persistent 100 B confirmed into a durable queue, RSS, then drain",
}


def add_consumed(row: dict[str, Any], flow: bool = True) -> dict[str, Any]:
    """consumed = delivered to consumers; consumed/published compares the two rates, which
    only means something while both run at once (not for a backlog, filled then drained).
    broker_cores_avg: the broker's CPU seconds per second of the run."""
    row["consumed"] = row.get("delivered")
    row["consumed_per_s"] = row.get("delivered_per_s")
    published, consumed = row.get("published_per_s"), row["consumed_per_s"]
    row["consumed_over_published"] = (consumed / published if flow and published and
                                      consumed is not None else None)
    cpu, wall = row.get("broker_cpu_s"), row.get("broker_wall_s")
    row["broker_cores_avg"] = cpu / wall if cpu is not None and wall else None
    return row


# --- scenarios ---------------------------------------------------------------------------------


class Control:
    """The benchmark's own connection for declaring and deleting queues."""

    def __init__(self, url: str):
        self.url = url
        self.client: FastClient | None = None
        self.channel = 0

    def _ensure(self) -> FastClient:
        if self.client is None:
            self.client = FastClient(self.url, timeout=30, name="bench-control")
            self.channel = self.client.open_channel()
        return self.client

    def declare(self, queue: str, durable: bool, queue_type: str | None) -> None:
        client = self._ensure()
        arguments = {"x-queue-type": queue_type} if queue_type else {}
        try:
            client.queue_declare(self.channel, queue, durable=durable, arguments=arguments)
        except ChannelClosed:
            self.channel = client.open_channel()
            raise

    def message_count(self, queue: str) -> int | None:
        client = self._ensure()
        try:
            return client.queue_declare(self.channel, queue, passive=True).message_count
        except ChannelClosed:
            self.channel = client.open_channel()
            return None

    def delete(self, queue: str) -> None:
        try:
            client = self._ensure()
            client.queue_delete(self.channel, queue)
        except ChannelClosed:
            self.channel = self.client.open_channel()
        except (OSError, ConnectionClosed, TimeoutError):
            self.close()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def scenario_config(name: str, options) -> dict[str, Any]:
    ack = {"no_ack": False, "prefetch": options.prefetch,
           "ack_every": max(1, options.prefetch // 2)}
    noack = {"no_ack": True, "prefetch": 0, "ack_every": 0}
    transient = {"durable": False, "persistent": False, "confirm_window": 0, "queue_type": None}
    durable = {"durable": True, "persistent": True, "queue_type": options.queue_type}
    configs = {
        "transient-autoack": dict(transient, **noack, pairs=1, body=100),
        "transient-ack": dict(transient, **ack, pairs=1, body=100),
        "persistent-confirm": dict(durable, **ack, pairs=1, body=100,
                                   confirm_window=options.confirm_window),
        "confirm-each": dict(durable, **ack, pairs=1, body=100, confirm_window=1),
        "fanout-4x4": dict(transient, **noack, pairs=4, body=100),
        "large-64k": dict(transient, **noack, pairs=1, body=65536),
        "backlog-200k": dict(durable, **ack, pairs=1, body=100,
                             confirm_window=options.confirm_window),
    }
    config = configs[name]
    config["max_lag"] = max(1, min(options.max_lag, options.max_lag_bytes // config["body"]))
    return config


def run_scenario(target: Target, name: str, options, run_id: str,
                 queue_type: str | None = "default") -> dict[str, Any]:
    config = scenario_config(name, options)
    if queue_type != "default":
        config["queue_type"] = queue_type
    row: dict[str, Any] = {"type": "scenario", "scenario": name, "broker": target.label,
                           "client": OWN_CLIENT, "client_scenario": name, "status": "ok", "queue_type": config["queue_type"] or "classic",
                           "body_bytes": config["body"], "pairs": config["pairs"]}
    queues = [f"bench-{run_id}-{name}-{config['queue_type'] or 'classic'}-{i}"
              for i in range(config["pairs"])]
    control = Control(target.url)
    started = time.monotonic()
    try:
        try:
            for queue in queues:
                control.declare(queue, config["durable"], config["queue_type"])
        except (ChannelClosed, ConnectionClosed) as error:
            row.update(status="skipped", error=f"queue.declare refused: {error}")
            return row
        if name == "backlog-200k":
            row.update(_run_backlog(target, queues[0], config, options, control))
        else:
            pub = {"body": config["body"], "persistent": config["persistent"],
                   "confirm_window": config["confirm_window"], "batch": options.batch,
                   "max_lag": config["max_lag"], "rate": options.rate}
            con = {"no_ack": config["no_ack"], "prefetch": config["prefetch"],
                   "ack_every": config["ack_every"]}
            phase = run_phase(target, [{"queue": q, "pub": pub, "con": con} for q in queues],
                              duration=options.duration, limit=None,
                              drain_timeout=options.drain_timeout,
                              hard_timeout=options.duration + 2 * options.drain_timeout + 30)
            row.update(summarize(phase))
            row["confirm_window"] = config["confirm_window"]
            row["max_lag"] = config["max_lag"]
            if phase["errors"]:
                row.update(status="error", error="; ".join(phase["errors"])[:2000])
            elif row["delivered"] < row["published"]:
                row["note"] = f"{row['published'] - row['delivered']} not delivered in time"
    except (OSError, AMQPError, TimeoutError, RuntimeError) as error:
        row.update(status="error", error=f"{type(error).__name__}: {error}")
    finally:
        for queue in queues:
            control.delete(queue)
        control.close()
        row["seconds"] = round(time.monotonic() - started, 2)
        add_consumed(row, flow=name != "backlog-200k")
    return row


def _run_backlog(target: Target, queue: str, config: dict, options,
                 control: Control) -> dict[str, Any]:
    count = options.backlog
    pub = {"body": config["body"], "persistent": True, "confirm_window": config["confirm_window"],
           "batch": options.batch, "max_lag": 0}
    fill = run_phase(target, [{"queue": queue, "pub": pub, "con": None}], duration=None,
                     limit=count, drain_timeout=options.drain_timeout,
                     hard_timeout=options.backlog_timeout)
    row = summarize(fill)
    row["confirm_window"] = config["confirm_window"]
    if fill["errors"]:
        row.update(status="error", error="; ".join(fill["errors"])[:2000])
        return row
    time.sleep(1.0)  # let the broker settle before measuring its memory
    root = target.root_pid()
    if root:
        rss, pss = tree_memory(process_tree(root))
        row["backlog_rss_mb"], row["backlog_pss_mb"] = round(rss, 1), round(pss, 1)
    in_queue = control.message_count(queue)
    row["backlog_messages"] = in_queue
    expected = in_queue if in_queue is not None else row["confirmed"]
    con = {"no_ack": False, "prefetch": config["prefetch"], "ack_every": config["ack_every"]}
    drain = run_phase(target, [{"queue": queue, "pub": None, "con": con, "expected": expected}],
                      duration=None, limit=None, drain_timeout=options.backlog_timeout,
                      hard_timeout=options.backlog_timeout + 30)
    drained = summarize(drain)
    row["delivered"] = drained["delivered"]
    row["delivered_per_s"] = row["drain_per_s"] = drained["delivered_per_s"]
    # Latencies of a drained backlog are mostly the time messages sat in it.
    row["drain_e2e_p50_ms"], row["drain_e2e_p99_ms"] = drained["e2e_p50_ms"], drained["e2e_p99_ms"]
    row["client_cpu_s"] += drained["client_cpu_s"]
    if drained["broker_cpu_s"] is not None and row["broker_cpu_s"] is not None:
        row["broker_cpu_s"] += drained["broker_cpu_s"]
    row["broker_wall_s"] += drained["broker_wall_s"]
    for key in ("broker_rss_mb", "broker_pss_mb"):
        if drained[key] is not None:
            row[key] = max(row[key] or 0, drained[key])
    if drain["errors"]:
        row.update(status="error", error="; ".join(drain["errors"])[:2000])
    elif row["delivered"] < expected:
        row["note"] = f"drained {row['delivered']} of {expected}"
    return row


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="warren bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios (amqp-perf's name of the closest one):\n" + "\n".join(
            f"  {k:20} {v} ({external.EXTERNAL_NAMES[k]})" for k, v in SCENARIOS.items()))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="AMQP URL of a running broker (default "
                       f"{DEFAULT_URL.replace('%', '%%')})")
    where.add_argument("--warren", action="store_true",
                       help="start a `warren serve` on a free port with a temp data dir")
    where.add_argument("--compare", action="store_true",
                       help="run against a private RabbitMQ node and a private Warren, "
                            "alternating, and print Warren/RabbitMQ ratios")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated scenarios, the bench's or amqp-perf's names "
                             "(default: all)")
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
    parser.add_argument("--json-only", action="store_true", help="no table, only JSON lines")
    options = parser.parse_args(argv)
    if options.quick:
        options.duration = min(options.duration, 1.0)
    options.backlog = options.backlog or (2_000 if options.quick else 200_000)
    options.drain_timeout = options.drain_timeout or max(10.0, options.duration)
    options.backlog_timeout = options.backlog_timeout or (60.0 if options.quick else 300.0)
    names = [external.canonical(s.strip()) for s in options.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(SCENARIOS)}; "
                     f"or amqp-perf's: {', '.join(external.ALIASES)})")
    options.scenario_list = list(dict.fromkeys(names))
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


def best_rabbit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The better RabbitMQ row of a scenario (classic vs quorum): by confirmed/s, then
    delivered/s."""
    good = [r for r in rows if r["status"] == "ok"]
    if not good:
        return rows[0] if rows else None
    return max(good, key=lambda r: (r.get("confirmed_per_s") or 0, r.get("consumed_per_s") or 0))


def run_client(target: Target, name: str, client: str, options, run_id: str,
               both_queue_types: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One scenario measured by one client: its rows, and the one to compare. RabbitMQ's
    persistent-confirm runs with classic and quorum queues (both_queue_types) unless
    --queue-type says which, and the better one is compared."""
    queue_types: list[str | None] = [options.queue_type]
    if both_queue_types and name == "persistent-confirm" and options.queue_type is None:
        queue_types = ["classic", "quorum"]
    rows = []
    for queue_type in queue_types:
        log(f"# {target.label}: {name}" + (f" ({queue_type})" if len(queue_types) > 1 else "")
            + f", measured by {client} ...")
        if client == OWN_CLIENT:
            row = run_scenario(target, name, options, run_id,
                               queue_type if len(queue_types) > 1 else "default")
        else:
            row = external.run(options.external_client, target, name, options, log=log,
                               queue_type=queue_type)
        print_json(row)
        rows.append(row)
    return rows, (best_rabbit(rows) if len(rows) > 1 else rows[0])


def run_all(options, run_id: str, targets: list[Target], rows: list[dict[str, Any]],
            pairs: list[tuple[dict, dict]]) -> None:
    """Every scenario, on each broker (--compare: RabbitMQ and Warren, alternating which goes
    first), measured by each client in turn on the same broker. A Warren is started afresh
    for each scenario with --fresh-warren, else once."""
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
    for index, name in enumerate(options.scenario_list):
        order = [rabbit, None] if rabbit is not None else [None]
        if index % 2:
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
                    measured, chosen = run_client(target, name, client, options, run_id,
                                                  both_queue_types=target is rabbit)
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
    """Rows by scenario, then Warren before RabbitMQ, then client."""
    brokers = {"warren": 0, "rabbitmq": 1}
    return sorted(rows, key=lambda row: (options.scenario_list.index(row["scenario"]),
                                         brokers.get(row["broker"], 2),
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
        f"Python {sys.version.split()[0]}")
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
