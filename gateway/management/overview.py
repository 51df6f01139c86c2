"""The broker as a whole: /api/overview (totals, rates and the node's listeners),
/api/nodes, /api/cluster-name, /api/extensions and /api/whoami."""

from __future__ import annotations

import os
import time

from .. import __version__
from ..broker.exchange import EXCHANGE_TYPES
from . import metrics, shapes
from .health import failing_shards
from .http import Request, Response, bad_request, not_found
from .listing import listed
from .rights import is_monitor, require_admin, require_monitor
from .shapes import COMPATIBLE_RABBITMQ

# the overview's message_stats for monitors, from the broker's totals
GLOBAL_STATS = (("publish", "received"), ("confirm", "confirmed"), ("deliver_get", "delivered"),
                ("deliver", "consume_manual_ack"), ("deliver_no_ack", "consume_auto_ack"),
                ("get", "get_manual_ack"), ("get_no_ack", "get_auto_ack"),
                ("get_empty", "get_empty"), ("redeliver", "redelivered"),
                ("ack", "acknowledged"), ("drop_unroutable", "unroutable_dropped"),
                ("return_unroutable", "unroutable_returned"))


async def overview(management, request: Request, rest: list[str]) -> Response:
    figures = await management.sampler.queue_figures()
    gateway = management.gateway
    # Monitors see global totals, the node and its listeners; the others totals
    # of their vhosts and connections.
    monitor = is_monitor(request.user)
    vhosts = (list(gateway.catalogue.vhosts.values()) if monitor else
              [gateway.catalogue.vhosts[name] for name in management.permitted_vhosts(request)])
    queues = [meta.qid for vhost in vhosts for meta in vhost.queues.values()]
    figures = [figures[qid] for qid in queues if qid in figures]
    connections = management.snapshots(request)
    ready = sum(f["ready"] for f in figures)
    unacked = sum(f["unacked"] for f in figures)
    answer = {
        "management_version": COMPATIBLE_RABBITMQ,
        "rabbitmq_version": COMPATIBLE_RABBITMQ,
        "product_name": "Warren", "product_version": __version__,
        "erlang_version": "none (Python)", "cluster_name": management.cluster_name(),
        "rates_mode": "basic",
        "exchange_types": [{"name": kind, "description": f"AMQP {kind} exchange",
                            "enabled": True} for kind in sorted(EXCHANGE_TYPES)],
        "object_totals": {
            "connections": len(connections),
            "channels": sum(len(c.channels) for c in connections),
            "exchanges": sum(len(v.exchanges) for v in vhosts),
            "queues": len(queues),
        },
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready,
                         "messages_unacknowledged": unacked},
        # the broker's own counts for monitors (what reached no queue included),
        # the sums over their queues for the others
        "message_stats": (_global_stats(management) if monitor
                          else shapes.message_stats(figures)),
    }
    if monitor:
        listeners = management.listeners
        answer["node"] = shapes.NODE
        answer["listeners"] = listeners
        answer["contexts"] = [{"node": shapes.NODE, "description": "Warren management",
                               "path": "/", "port": str(listener["port"])}
                              for listener in listeners
                              if listener["protocol"] in ("http", "https")]
        answer["object_totals"]["consumers"] = sum(
            len(ch.consumers) for c in connections for ch in c.channels)
    management.sampler.add_samples(
        request, ["totals"] if monitor else [("vhost", v.name) for v in vhosts],
        answer["queue_totals"], answer["message_stats"],
        GLOBAL_STATS if monitor else shapes.QUEUE_STATS)
    return Response.json(answer)


def _global_stats(management) -> dict:
    totals, rates = management.gateway.broker_totals(), management.sampler.totals_rates()
    stats = {}
    for name, key in GLOBAL_STATS:
        stats[name] = totals[key]
        stats[f"{name}_details"] = {"rate": round(rates[key], 1)}
    return stats


async def cluster_name(management, request: Request, rest: list[str]) -> Response:
    if request.method == "GET":
        return Response.json({"name": management.cluster_name()})
    require_admin(request)  # PUT
    name = request.json({"name": str}).get("name")
    if not name:
        raise bad_request("name is required")
    management.gateway.catalogue.meta.set_cluster_name(name)
    return Response(204)


async def extensions(management, request: Request, rest: list[str]) -> Response:
    """The management UI's plugins: none; the dashboard is one page."""
    return Response.json([])


async def whoami(management, request: Request, rest: list[str]) -> Response:
    return Response.json({"name": request.user.name, "tags": request.user.tags})


async def nodes(management, request: Request, rest: list[str]) -> Response:
    require_monitor(request)
    found = [_node(management), *_other_nodes(management)]
    if rest:
        node = next((n for n in found if n["name"] == rest[0]), None)
        if node is None:
            raise not_found()
        return Response.json(node)
    return listed(request, found)


def _other_nodes(management) -> list[dict]:
    """The cluster's other nodes, running or not, as this node knows them."""
    cluster = management.gateway.cluster
    if cluster is None:
        return []
    members = cluster.members
    return [{"name": name, "type": "disc", "running": name in members.running,
             "being_drained": False, "partitions": [],
             "shards": info.shards, "uptime": int((time.time() - info.started) * 1000)
             if name in members.running else 0}
            for name, info in sorted(members.known.items()) if name != members.me]


def _node(management) -> dict:
    gateway = management.gateway
    pids = management.pids()
    return {
        "name": shapes.NODE, "type": "disc", "running": True,
        "mem_used": sum(metrics.rss(pid) for pid in pids),
        "mem_limit": gateway.config.memory_limit_bytes(),
        "mem_alarm": gateway.alarms.on("memory"),
        "disk_free": gateway.alarms.disk_free,
        "disk_free_limit": gateway.alarms.disk_free_limit,
        "disk_free_alarm": gateway.alarms.on("disk"),
        "fd_used": len(os.listdir("/proc/self/fd")),
        "proc_used": len(pids), "processors": os.cpu_count(),
        "uptime": int((time.time() - management.started) * 1000),
        "partitions": [], "run_queue": 0,
        "shards": gateway.shards.count,
        "failing_shards": failing_shards(gateway),
    }
