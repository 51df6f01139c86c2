"""The JSON of RabbitMQ's management API for what Warren has: users,
permissions, policies, exchanges, bindings, and connections, channels and
consumers from their typed snapshots (gateway/snapshots.py)."""

from __future__ import annotations

import hashlib
import socket

from ..snapshots import ChannelInfo, ConnectionInfo, ConsumerInfo

NODE = f"warren@{socket.gethostname()}"
COMPATIBLE_RABBITMQ = "3.13.7"  # the management API version Warren's JSON follows

# RabbitMQ's message_stats names and the shards' per-queue counters they come from
QUEUE_STATS = (("publish", "published"), ("deliver_get", "delivered"), ("ack", "acked"),
               ("redeliver", "redelivered"))


def message_stats(figures) -> dict:
    """message_stats of queues: counters summed, with their current rates."""
    stats = {}
    for name, key in QUEUE_STATS:
        stats[name] = sum(f.get(key, 0) for f in figures)
        stats[f"{name}_details"] = {"rate": round(sum(f.get("rates", {}).get(key, 0.0)
                                                      for f in figures), 1)}
    return stats


def user(u) -> dict:
    return {"name": u.name, "password_hash": u.password_hash,
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": u.tags,
            "limits": u.limits}


def permission(p) -> dict:
    return {"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
            "read": p.read}


def policy(p) -> dict:
    return {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
            "definition": p.definition, "priority": p.priority}


def exchange(x) -> dict:
    return {"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable,
            "auto_delete": x.auto_delete, "internal": x.internal, "arguments": x.arguments,
            "policy": x.policy.name if x.policy else None, "user_who_performed_action": ""}


def properties_key(routing_key: str, args: dict) -> str:
    if not args:
        return routing_key or "~"
    digest = hashlib.sha1(repr(sorted(args.items())).encode()).hexdigest()[:22]
    return f"{routing_key}~{digest}"


def bindings_of(vhost) -> list[dict]:
    found = [{"source": "", "vhost": vhost.name, "destination": name,
              "destination_type": "queue", "routing_key": name, "arguments": {},
              "properties_key": name} for name in sorted(vhost.queues)]
    for _, x in sorted(vhost.exchanges.items()):
        for (destination, routing_key, _), args in x.bindings.items():
            found.append({"source": x.name, "vhost": vhost.name,
                          "destination": destination[1], "destination_type": destination[0],
                          "routing_key": routing_key, "arguments": args,
                          "properties_key": properties_key(routing_key, args)})
    return found


def connection(conn: ConnectionInfo, rates: dict | None = None) -> dict:
    rates = rates or {}
    return {"name": conn.name, "user_provided_name": conn.user_provided_name,
            "user": conn.user, "vhost": conn.vhost,
            "peer_host": conn.peer_host, "peer_port": conn.peer_port, "host": conn.host,
            "port": conn.port, "channels": len(conn.channels), "state": conn.state,
            "protocol": "AMQP 0-9-1", "type": "network", "node": NODE, "auth_mechanism": "PLAIN",
            "client_properties": jsonable(conn.client_properties),
            "connected_at": int(conn.connected_at * 1000),
            "frame_max": conn.frame_max, "timeout": conn.heartbeat,
            "channel_max": conn.channel_max, "ssl": conn.tls,
            "recv_oct": conn.recv_oct, "recv_cnt": conn.recv_cnt,
            "send_oct": conn.send_oct, "send_cnt": conn.send_cnt, "send_pend": 0,
            "recv_oct_details": {"rate": round(rates.get("recv_oct", 0.0), 1)},
            "send_oct_details": {"rate": round(rates.get("send_oct", 0.0), 1)}}


def _channel_details(conn: ConnectionInfo, ch: ChannelInfo) -> dict:
    return {"name": f"{conn.name} ({ch.number})", "number": ch.number,
            "connection_name": conn.name, "peer_host": conn.peer_host,
            "peer_port": conn.peer_port, "user": conn.user, "node": NODE}


def channel(conn: ConnectionInfo, ch: ChannelInfo) -> dict:
    return {"name": f"{conn.name} ({ch.number})", "number": ch.number,
            "connection_details": {"name": conn.name, "peer_host": conn.peer_host,
                                   "peer_port": conn.peer_port},
            "user": conn.user, "vhost": conn.vhost, "node": NODE,
            "consumer_count": ch.consumer_count,
            "messages_unacknowledged": ch.messages_unacknowledged,
            "prefetch_count": ch.prefetch_count,
            "global_prefetch_count": ch.global_prefetch_count,
            "confirm": ch.confirm, "transactional": ch.transactional,
            "state": "closing" if ch.closing else "running"}


def consumer(conn: ConnectionInfo, ch: ChannelInfo, c: ConsumerInfo,
             stream_offset: int | None = None) -> dict:
    """A consumer as RabbitMQ shows it; a stream's consumer with the offset it
    reads next."""
    shown = {"consumer_tag": c.tag, "queue": {"name": c.queue, "vhost": c.vhost},
            "channel_details": _channel_details(conn, ch),
            "ack_required": c.ack_required, "prefetch_count": c.prefetch_count,
            "exclusive": c.exclusive,
            "active": not c.timed_out, "activity_status": "timed_out" if c.timed_out else "up",
            "status": "timed_out" if c.timed_out else "active",
            "consumer_timeout": c.timeout_ms or None, "arguments": jsonable(c.arguments)}
    if stream_offset is not None:
        shown["stream_offset"] = stream_offset
    return shown


def jsonable(value):
    # Loops, not comprehensions: one frame a level, as tables nest up to
    # fieldtable.MAX_DEPTH (a comprehension is a frame of its own).
    if isinstance(value, dict):
        table = {}
        for k, v in value.items():
            table[k] = jsonable(v)
        return table
    if isinstance(value, (list, tuple)):
        array = []
        for v in value:
            array.append(jsonable(v))
        return array
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
