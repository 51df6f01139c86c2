"""The bench's scenarios measured by its own client: what each one is, its queues
(declared before, deleted after), its phases and its row."""

from __future__ import annotations

import time
from typing import Any

from .fastclient import AMQPError, ChannelClosed, ConnectionClosed, FastClient
from .output import OWN_CLIENT
from .phases import run_phase, summarize
from .procs import process_tree, tree_memory
from .targets import Target

SCENARIOS: dict[str, str] = {
    "transient-autoack": "1 pub -> 1 con, 100 B, non-durable queue, no-ack consumer",
    "transient-ack": "1 -> 1, 100 B, non-durable, manual ack (prefetch, multiple every N)",
    "persistent-confirm": "1 -> 1, 100 B persistent, durable queue, confirm window 1000, ack",
    "confirm-each": "1 -> 1, 100 B persistent, durable queue, wait for each confirm, ack",
    "fanout-4x4": "4 pubs -> 4 queues -> 4 cons (one queue per pair), 100 B, no-ack",
    "large-64k": "1 -> 1, 64 KiB bodies, non-durable, no-ack",
    "backlog-200k": "200k persistent 100 B confirmed into a durable queue, RSS, then drain",
}



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
                           "client": OWN_CLIENT, "client_scenario": name, "status": "ok",
                           "queue_type": config["queue_type"] or "classic",
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
