"""Prometheus metrics with prometheus_client: a collector that reads the broker
at scrape time and exports RabbitMQ's metric names (those of its
rabbitmq_prometheus plugin), so RabbitMQ's Grafana dashboards work unchanged:
totals on /metrics, queue figures per (vhost, queue) on /metrics/per-object;
the warren_* families are what RabbitMQ has no name for (shards, rings, each
process's memory)."""

from __future__ import annotations

import importlib.metadata
import os
import resource

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .. import __version__
from . import shapes
from .shapes import COMPATIBLE_RABBITMQ

__all__ = ["CONTENT_TYPE_LATEST", "render", "rss"]

PROTOCOL = {"protocol": "amqp091"}
# RabbitMQ's queue types, by the value of x-queue-type
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue",
               "stream": "rabbit_stream_queue"}

# per-queue figures: RabbitMQ's name, the shard's field, help
QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "unacked",
     "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", None, "Sum of ready and unacknowledged messages - total queue "
     "depth"),
    ("rabbitmq_queue_messages_ram_bytes", "ram_bytes", "Size of ready and unacknowledged "
     "messages stored in memory"),
    ("rabbitmq_queue_consumers", "consumers", "Consumers on a queue"),
)
QUEUE_COUNTERS = (
    ("rabbitmq_queue_messages_published", "published", "Total number of messages published "
     "to queues"),
    ("warren_queue_messages_delivered", "delivered", "Messages delivered from the queue "
     "since its shard started"),
    ("warren_queue_messages_acked", "acked", "Messages acknowledged from the queue since its "
     "shard started"),
    ("warren_queue_messages_redelivered", "redelivered", "Messages redelivered from the "
     "queue since its shard started"),
)
# broker totals: RabbitMQ's name (without _total), the Totals field, help, labels
GLOBAL_COUNTERS = (
    ("rabbitmq_connections_opened", "connections_opened", "Total number of connections opened",
     {}),
    ("rabbitmq_connections_closed", "connections_closed",
     "Total number of connections closed or terminated", {}),
    ("rabbitmq_channels_opened", "channels_opened", "Total number of channels opened", {}),
    ("rabbitmq_channels_closed", "channels_closed", "Total number of channels closed", {}),
    ("rabbitmq_queues_declared", "queues_declared", "Total number of queues declared", {}),
    ("rabbitmq_queues_created", "queues_created", "Total number of queues created", {}),
    ("rabbitmq_queues_deleted", "queues_deleted", "Total number of queues deleted", {}),
    ("rabbitmq_global_messages_received", "received",
     "Total number of messages received from publishers", PROTOCOL),
    ("rabbitmq_global_messages_received_confirm", "received_confirm",
     "Total number of messages received from publishers expecting confirmations", PROTOCOL),
    ("rabbitmq_global_messages_routed", "routed",
     "Total number of messages routed to queues or streams", PROTOCOL),
    ("rabbitmq_global_messages_unroutable_dropped", "unroutable_dropped",
     "Total number of messages published as non-mandatory into an exchange and dropped as "
     "unroutable", PROTOCOL),
    ("rabbitmq_global_messages_unroutable_returned", "unroutable_returned",
     "Total number of messages published as mandatory into an exchange and returned to the "
     "publisher as unroutable", PROTOCOL),
    ("rabbitmq_global_messages_confirmed", "confirmed",
     "Total number of messages confirmed to publishers", PROTOCOL),
    ("rabbitmq_global_messages_delivered", "delivered",
     "Total number of messages delivered to consumers", PROTOCOL),
    ("rabbitmq_global_messages_acknowledged", "acknowledged",
     "Total number of messages acknowledged by consumers", PROTOCOL),
    ("rabbitmq_global_messages_delivered_consume_manual_ack", "consume_manual_ack",
     "Total number of messages delivered to consumers using manual acknowledgement mode",
     PROTOCOL),
    ("rabbitmq_global_messages_delivered_consume_auto_ack", "consume_auto_ack",
     "Total number of messages delivered to consumers using automatic acknowledgement mode",
     PROTOCOL),
    ("rabbitmq_global_messages_delivered_get_manual_ack", "get_manual_ack",
     "Total number of messages delivered to consumers via basic.get using manual "
     "acknowledgement mode", PROTOCOL),
    ("rabbitmq_global_messages_delivered_get_auto_ack", "get_auto_ack",
     "Total number of messages delivered to consumers via basic.get using automatic "
     "acknowledgement mode", PROTOCOL),
    ("rabbitmq_global_messages_get_empty", "get_empty",
     "Total number of times basic.get operations fetched no message", PROTOCOL),
    ("rabbitmq_global_messages_redelivered", "redelivered",
     "Total number of messages redelivered to consumers", PROTOCOL),
    # the same counts under the channel metrics' names, which RabbitMQ's
    # RabbitMQ-Overview dashboard charts
    ("rabbitmq_channel_messages_published", "received",
     "Total number of messages published into an exchange on a channel", {}),
    ("rabbitmq_channel_messages_confirmed", "confirmed",
     "Total number of messages published into an exchange and confirmed on the channel", {}),
    ("rabbitmq_channel_messages_unroutable_returned", "unroutable_returned",
     "Total number of messages published as mandatory into an exchange and returned to the "
     "publisher as unroutable", {}),
    ("rabbitmq_channel_messages_unroutable_dropped", "unroutable_dropped",
     "Total number of messages published as non-mandatory into an exchange and dropped as "
     "unroutable", {}),
    ("rabbitmq_channel_messages_delivered_ack", "consume_manual_ack",
     "Total number of messages delivered to consumers in manual acknowledgement mode", {}),
    ("rabbitmq_channel_messages_delivered", "consume_auto_ack",
     "Total number of messages delivered to consumers in automatic acknowledgement mode", {}),
    ("rabbitmq_channel_get_ack", "get_manual_ack",
     "Total number of messages fetched with basic.get in manual acknowledgement mode", {}),
    ("rabbitmq_channel_get", "get_auto_ack",
     "Total number of messages fetched with basic.get in automatic acknowledgement mode", {}),
    ("rabbitmq_channel_get_empty", "get_empty",
     "Total number of times basic.get operations fetched no message", {}),
    ("rabbitmq_channel_messages_redelivered", "redelivered",
     "Total number of messages redelivered to consumers", {}),
    ("rabbitmq_channel_messages_acked", "acknowledged",
     "Total number of messages acknowledged by consumers", {}),
)


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


class BrokerCollector(Collector):
    """The broker as Prometheus sees it, read when the registry collects (at
    scrape time). `figures` are the shards' queue figures fetched for this
    scrape; `per_object` labels queue figures with vhost and queue instead of
    summing them."""

    def __init__(self, management, figures: dict[int, dict], per_object: bool):
        self.management = management
        self.figures = figures
        self.per_object = per_object

    def collect(self):
        management, gateway = self.management, self.management.gateway
        yield from self._identity()
        connections = [c.snapshot() for c in management.connections()]
        channels = [ch for c in connections for ch in c.channels]
        queues = [meta for vhost in gateway.catalogue.vhosts.values()
                  for meta in vhost.queues.values()]
        yield _gauge("rabbitmq_connections", "Connections currently open", len(connections))
        yield _gauge("rabbitmq_channels", "Channels currently open", len(channels))
        yield _gauge("rabbitmq_consumers", "Consumers currently connected",
                     sum(len(ch.consumers) for ch in channels))
        yield _gauge("rabbitmq_queues", "Queues available", len(queues))
        yield _gauge("rabbitmq_channel_consumers", "Consumers on a channel",
                     sum(ch.consumer_count for ch in channels))
        yield _gauge("rabbitmq_channel_messages_unacked",
                     "Delivered but not yet acknowledged messages",
                     sum(ch.messages_unacknowledged for ch in channels))
        yield _gauge("rabbitmq_channel_messages_unconfirmed",
                     "Published but not yet confirmed messages",
                     sum(ch.messages_unconfirmed for ch in channels))
        yield _gauge("rabbitmq_channel_prefetch", "Total limit of unacknowledged messages for "
                     "all consumers on a channel", sum(ch.global_prefetch_count for ch in channels))
        yield _gauge("rabbitmq_process_open_tcp_sockets", "Open TCP sockets", len(connections))
        yield from self._queues(queues)
        totals = gateway.broker_totals()
        for name, field, text, labels in GLOBAL_COUNTERS:
            family = CounterMetricFamily(name, text, labels=list(labels))
            family.add_metric(list(labels.values()), totals[field])
            yield family
        yield from self._resources()
        yield from self._shards()

    def _identity(self):
        build = GaugeMetricFamily(
            "rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
            labels=["rabbitmq_version", "prometheus_plugin_version",
                    "prometheus_client_version", "erlang_version", "product",
                    "product_version"])
        build.add_metric([COMPATIBLE_RABBITMQ, __version__,
                          prometheus_client_version(), "none (Python)", "Warren", __version__],
                         1)
        yield build
        identity = GaugeMetricFamily(
            "rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
            labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"])
        identity.add_metric([shapes.NODE, self.management.cluster_name(),
                             self.management.permanent_id()], 1)
        yield identity

    def _queues(self, queues):
        labels = ["vhost", "queue"] if self.per_object else []
        rows = [(meta, self.figures.get(meta.qid, {})) for meta in queues]

        def family(kind, name: str, field: str | None, text: str):
            metric = kind(name, text, labels=labels)
            values = [(f.get("ready", 0) + f.get("unacked", 0)) if field is None
                      else f.get(field, 0) for _, f in rows]
            if self.per_object:
                for (meta, _), value in zip(rows, values):
                    metric.add_metric([meta.spec.vhost, meta.spec.name], value)
            else:
                metric.add_metric([], sum(values))
            return metric

        for name, field, text in QUEUE_GAUGES:
            yield family(GaugeMetricFamily, name, field, text)
        for name, field, text in QUEUE_COUNTERS:
            yield family(CounterMetricFamily, name, field, text)

    def _resources(self):
        gateway, management = self.management.gateway, self.management
        yield _gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes",
                     gateway.config.memory_limit_bytes())
        yield _gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes",
                     sum(rss(pid) for pid in management.pids()))
        yield _gauge("rabbitmq_process_open_fds", "Open file descriptors",
                     len(os.listdir("/proc/self/fd")))
        yield _gauge("rabbitmq_process_max_fds", "Open file descriptors limit",
                     resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        yield _gauge("rabbitmq_disk_space_available_limit_bytes",
                     "Free disk space low watermark in bytes", gateway.alarms.disk_free_limit)
        yield _gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes",
                     gateway.alarms.disk_free)
        yield _gauge("rabbitmq_alarms_memory_used_watermark",
                     "is 1 if VM memory watermark alarm is in effect",
                     int(gateway.alarms.on("memory")))
        yield _gauge("rabbitmq_alarms_free_disk_space_watermark",
                     "is 1 if free disk space watermark alarm is in effect",
                     int(gateway.alarms.on("disk")))
        yield _gauge("rabbitmq_alarms_file_descriptor_limit",
                     "is 1 if file descriptor limit alarm is in effect", 0)

    def _shards(self):
        management, gateway = self.management, self.management.gateway
        fsyncs = CounterMetricFamily("warren_shard_fsyncs", "Store commits (one fsync each) "
                                     "of a shard", labels=["shard"])
        written = CounterMetricFamily("warren_shard_written_records",
                                      "Records written by those commits", labels=["shard"])
        for shard, (commits, records) in sorted(management.sampler.shard_fsyncs.items()):
            fsyncs.add_metric([str(shard)], commits)
            written.add_metric([str(shard)], records)
        yield fsyncs
        yield written
        rings = GaugeMetricFamily("warren_shard_ring_used_bytes",
                                  "Bytes waiting in a shard ring", labels=["shard", "ring"])
        for link in gateway.shards.local():
            if link.alive:
                for ring_name in ("commands", "events"):
                    ring = getattr(link, ring_name)
                    rings.add_metric([str(link.index), ring_name],
                                     ring.spec().capacity - ring.free_space())
        yield rings
        memory = GaugeMetricFamily("warren_process_resident_memory_bytes",
                                   "RSS of each broker process", labels=["process"])
        memory.add_metric(["gateway"], rss(os.getpid()))
        for index, pid in sorted(management.shard_pids().items()):
            memory.add_metric([f"shard-{index}"], rss(pid))
        yield memory


def _gauge(name: str, text: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def prometheus_client_version() -> str:
    return importlib.metadata.version("prometheus_client")


async def render(management, per_object: bool = False) -> bytes:
    """The exposition text for one scrape."""
    figures = await management.sampler.queue_figures()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(management, figures, per_object))
    return generate_latest(registry)
