"""Prometheus metrics (text exposition format) at /metrics."""

from __future__ import annotations

import os


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def render(management) -> str:
    gateway = management.gateway
    figures = await management.queue_figures()
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")

    queues = [(meta, figures.get(meta.qid, {})) for vhost in gateway.vhosts.values()
              for meta in vhost.queues.values()]

    def per_queue(key: str):
        return [({"vhost": m.vhost, "queue": m.name}, f.get(key, 0)) for m, f in queues]

    family("warren_queue_messages_ready", "gauge", "Messages ready for delivery",
           per_queue("ready"))
    family("warren_queue_messages_unacked", "gauge", "Messages delivered and not yet settled",
           per_queue("unacked"))
    family("warren_queue_consumers", "gauge", "Consumers of the queue", per_queue("consumers"))
    for key, what in (("published", "published into"), ("delivered", "delivered from"),
                      ("acked", "acknowledged from"), ("redelivered", "redelivered from")):
        family(f"warren_queue_messages_{key}_total", "counter",
               f"Messages {what} the queue since its shard started", per_queue(key))
    connections = management._connections()
    family("warren_connections", "gauge", "Open AMQP connections", [({}, len(connections))])
    family("warren_channels", "gauge", "Open channels",
           [({}, sum(len(c.channels) for c in connections))])
    family("warren_consumers", "gauge", "Consumers",
           [({}, sum(len(ch.consumers) for c in connections for ch in c.channels.values()))])
    family("warren_shard_fsyncs_total", "counter", "Store commits (one fsync each) of a shard",
           [({"shard": k}, v[0]) for k, v in sorted(management.shard_fsyncs.items())])
    family("warren_shard_written_records_total", "counter", "Records written by those commits",
           [({"shard": k}, v[1]) for k, v in sorted(management.shard_fsyncs.items())])
    rings = []
    for link in gateway.shards:
        if link.alive:
            for ring_name in ("commands", "events"):
                ring = getattr(link, ring_name)
                capacity = ring.spec().capacity
                rings.append(({"shard": link.index, "ring": ring_name},
                              capacity - ring.free_space()))
    family("warren_shard_ring_used_bytes", "gauge", "Bytes waiting in a shard ring", rings)
    memory = [({"process": "gateway"}, rss(os.getpid()))]
    memory += [({"process": f"shard-{i}"}, rss(pid))
               for i, pid in sorted(management.shard_pids().items())]
    family("warren_process_resident_memory_bytes", "gauge", "RSS of each broker process", memory)
    return "\n".join(lines) + "\n"
