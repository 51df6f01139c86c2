"""`warren bench --external-client PATH`: an external load generator measures the broker.

The external client is amqp-perf, an independent AMQP 0-9-1 load generator in Go on
Debian's rabbitmq/amqp091-go (the user builds it from its own sources; Warren does not
ship it), or anything that takes the same arguments and prints the same JSON line. For
each scenario the bench runs

    PATH --url URL --scenario NAME --seconds N --json [--rate R] [--pid PID]
         [--count N (backlog)] [--queue-type T]

with PID the root of the broker's process tree when the bench knows it (amqp-perf adds
the descendants: a Warren's shards, RabbitMQ's helpers), reads the last JSON line it
prints and turns it into a row like the bench's own client's: same keys, same table.
A run that fails (non-zero exit, no JSON line, "ok": false, a timeout) is an error row.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

# The bench's scenario -> amqp-perf's closest one. confirm-each has a consumer, latency-1
# none; large-64k acks automatically, body-64k manually.
EXTERNAL_NAMES = {
    "transient-autoack": "transient-autoack",
    "transient-ack": "transient-manual",
    "persistent-confirm": "durable-confirm",
    "confirm-each": "latency-1",
    "fanout-4x4": "fanout4",
    "large-64k": "body-64k",
    "backlog-200k": "backlog",
}
ALIASES = {theirs: ours for ours, theirs in EXTERNAL_NAMES.items()}

# amqp-perf's warm-up (not measured) and own watchdog, which the bench's limit must exceed.
WARMUP_S = 1.0
WATCHDOG_S = 60.0
BACKLOG_WATCHDOG_S = 900.0


def canonical(name: str) -> str:
    """The bench's name of a scenario given by either name."""
    return ALIASES.get(name, name)


def client_label(path: str) -> str:
    return Path(path).name


def command(path: str, url: str, scenario: str, seconds: float, *, rate: float = 0.0,
            pid: int | None = None, count: int | None = None,
            queue_type: str | None = None) -> list[str]:
    """The external client's command line for the bench's scenario `scenario`."""
    name = EXTERNAL_NAMES.get(scenario, scenario)
    argv = [path, "--url", url, "--scenario", name, "--seconds", f"{seconds:g}", "--json"]
    if rate and name != "backlog":
        argv += ["--rate", f"{rate:g}"]
    if pid:
        argv += ["--pid", str(pid)]
    if count and name == "backlog":
        argv += ["--count", str(count)]
    if queue_type:
        argv += ["--queue-type", queue_type]
    return argv


def parse_json_line(stdout: str) -> dict[str, Any] | None:
    """The last line of stdout that is a JSON object, if any."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return a / b
    return None


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    """The bench's keys from an amqp-perf result (a flow scenario or the backlog)."""
    get = result.get
    row: dict[str, Any] = {
        "queue_type": get("queue_type"), "body_bytes": get("body_size"),
        "pairs": get("queues"), "confirm_window": get("confirm_window"),
        "published": get("published"), "confirmed": get("confirmed"), "nacked": get("nacked"),
        "confirm_p50_ms": get("confirm_p50_ms"), "confirm_p99_ms": get("confirm_p99_ms"),
    }
    if get("scenario") == "backlog":
        publish_s, drain_s = get("publish_s"), get("drain_s")
        row.update(
            published_per_s=_ratio(get("published"), publish_s),
            confirmed_per_s=get("publish_per_s"),
            consumed=get("drained"), consumed_per_s=get("drain_per_s"),
            drain_per_s=get("drain_per_s"), consumed_over_published=None,
            e2e_p50_ms=None, e2e_p99_ms=None,
            backlog_messages=get("queue_depth_after_publish"),
            backlog_rss_mb=get("broker_after_publish_rss_mb"),
            backlog_pss_mb=get("broker_after_publish_pss_mb"),
            client_cpu_s=get("client_cpu_s_total"))
        rss = [get(f"broker_{when}_rss_mb") for when in ("before", "after_publish", "after_drain")]
        pss = [get(f"broker_{when}_pss_mb") for when in ("before", "after_publish", "after_drain")]
        row["broker_rss_mb"] = max((v for v in rss if v is not None), default=None)
        row["broker_pss_mb"] = max((v for v in pss if v is not None), default=None)
        cpu = [get("publish_broker_cpu_s"), get("drain_broker_cpu_s")]
        if None not in cpu:
            row["broker_cpu_s"] = sum(cpu)
            row["broker_cores_avg"] = _ratio(sum(cpu), (publish_s or 0) + (drain_s or 0))
        else:
            row["broker_cpu_s"] = row["broker_cores_avg"] = None
    else:
        consumers = get("consumers")
        row.update(
            published_per_s=get("published_per_s"), confirmed_per_s=get("confirmed_per_s"),
            consumed=get("consumed"), consumed_per_s=get("consumed_per_s"),
            consumed_over_published=(_ratio(get("consumed_per_s"), get("published_per_s"))
                                     if consumers else None),
            e2e_p50_ms=get("e2e_p50_ms"), e2e_p99_ms=get("e2e_p99_ms"),
            broker_rss_mb=get("broker_end_rss_mb"), broker_pss_mb=get("broker_end_pss_mb"),
            broker_cpu_s=get("broker_cpu_s"), broker_cores_avg=get("broker_cores_avg"),
            client_cpu_s=get("client_cpu_s", get("client_cpu_s_total")),
            client_writes_per_s=get("client_writes_per_s"),
            left_in_queues_at_end=get("left_in_queues_at_end"),
            window_s=get("window_s"), rate_limit=get("rate_limit"))
    # The bench's own client calls consumed "delivered": both keys, same figures.
    row["delivered"], row["delivered_per_s"] = row["consumed"], row["consumed_per_s"]
    return row


def run(path: str, target, scenario: str, options, log=lambda text: None,
        queue_type: str | None = None) -> dict[str, Any]:
    """Run the external client for one scenario against `target` (a bench Target) and
    return its row; never raises for the client's own failures."""
    argv = command(path, target.url, scenario, options.duration, rate=options.rate,
                   pid=target.root_pid(), count=options.backlog, queue_type=queue_type)
    name = EXTERNAL_NAMES.get(scenario, scenario)
    row: dict[str, Any] = {"type": "scenario", "scenario": scenario, "broker": target.label,
                           "client": client_label(path), "client_scenario": name,
                           "status": "ok", "command": shlex.join(argv)}
    limit = (BACKLOG_WATCHDOG_S if name == "backlog" else
             options.duration + WARMUP_S + WATCHDOG_S) + 30
    started = time.monotonic()
    try:
        stdout, stderr, returncode = _execute(argv, limit)
    except OSError as error:
        row.update(status="error", error=f"cannot run {path}: {error}")
        return row
    finally:
        row["seconds"] = round(time.monotonic() - started, 2)
    for line in stderr.splitlines()[-5:]:
        log(f"# {row['client']}: {line}")
    result = parse_json_line(stdout)
    if result is None:
        tail = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1][:300]
        row.update(status="error", error=(
            "timed out" if returncode is None else f"exit status {returncode}")
            + f", no JSON line: {tail}")
        return row
    row.update(_figures(result))
    row["external"] = result
    if not result.get("ok") or returncode != 0:
        reason = result.get("error") or "ok is not true"
        row.update(status="error", error=(
            "timed out: " if returncode is None else f"exit status {returncode}: ") + str(reason))
    elif row.get("left_in_queues_at_end"):
        row["note"] = f"{row['left_in_queues_at_end']:,} left in queues"
    return row


def _execute(argv: list[str], limit: float) -> tuple[str, str, int | None]:
    """stdout, stderr and exit status (None: killed after `limit` seconds)."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        stdout, stderr = process.communicate(timeout=limit)
        return stdout, stderr, process.returncode
    except subprocess.TimeoutExpired:
        process.terminate()  # amqp-perf deletes its queues on SIGTERM
        try:
            stdout, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        return stdout, stderr, None
    except BaseException:  # Ctrl-C: let it delete its queues, briefly
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
