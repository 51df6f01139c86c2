"""Definitions export and import in RabbitMQ's format (users, vhosts, permissions,
policies, durable queues, exchanges and bindings), so they move between brokers."""

from __future__ import annotations

from storage.metastore import PolicyDef

from .. import __version__
from ..exchange import EXCHANGE, QUEUE, Exchange

COMPATIBLE_RABBITMQ = "3.13.7"


def export(broker) -> dict:
    access = broker.access
    queues, exchanges, bindings = [], [], []
    for vhost_name, vhost in sorted(broker.vhosts.items()):
        for name, meta in sorted(vhost.queues.items()):
            if meta.owner is None and meta.durable:
                queues.append({"name": name, "vhost": vhost_name, "durable": True,
                               "auto_delete": meta.auto_delete, "arguments": meta.arguments})
        for name, exchange in sorted(vhost.exchanges.items()):
            if name and not name.startswith("amq.") and exchange.durable:
                exchanges.append({"name": name, "vhost": vhost_name, "type": exchange.type,
                                  "durable": True, "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal,
                                  "arguments": exchange.arguments})
            if not name:
                continue
            for (destination, routing_key, _), args in exchange.bindings.items():
                bindings.append({"source": name, "vhost": vhost_name,
                                 "destination": destination[1],
                                 "destination_type": destination[0],
                                 "routing_key": routing_key, "arguments": args})
    return {
        "rabbit_version": COMPATIBLE_RABBITMQ, "rabbitmq_version": COMPATIBLE_RABBITMQ,
        "product_name": "Warren", "product_version": __version__,
        "users": [{"name": u.name, "password_hash": u.password_hash,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": u.tags,
                   "limits": u.limits} for _, u in sorted(access.users.items())],
        "vhosts": [{"name": name, "description": d.description, "limits": d.limits,
                    "metadata": {"description": d.description, "tags": []}}
                   for name, d in sorted(broker.vhost_defs.items())],
        "permissions": [{"user": p.user, "vhost": p.vhost, "configure": p.configure,
                         "write": p.write, "read": p.read}
                        for _, p in sorted(access.permissions.items())],
        "topic_permissions": [], "parameters": [], "global_parameters": [],
        "policies": [{"vhost": p.vhost, "name": p.name, "pattern": p.pattern,
                      "apply-to": p.apply_to, "definition": p.definition,
                      "priority": p.priority}
                     for v in sorted(broker.policies) for _, p in sorted(broker.policies[v].items())],
        "queues": queues, "exchanges": exchanges, "bindings": bindings,
    }


def import_(broker, data: dict) -> None:
    """Create what the definitions name and Warren lacks; existing objects stay."""
    access = broker.access
    for v in data.get("vhosts", []):
        if v["name"] not in broker.vhosts:
            broker.add_vhost(v["name"], v.get("description", ""), v.get("limits") or {})
    for u in data.get("users", []):
        tags = u.get("tags", [])
        if isinstance(tags, str):
            tags = [t for t in tags.split(",") if t]
        if u.get("hashing_algorithm", "rabbit_password_hashing_sha256") != \
                "rabbit_password_hashing_sha256":
            raise ValueError(f"user {u['name']}: unsupported hashing algorithm "
                             f"{u['hashing_algorithm']}")
        access.put_user(u["name"], None, tags, u.get("password_hash", ""), u.get("limits") or {})
    for p in data.get("permissions", []):
        access.set_permissions(p["user"], p["vhost"], p.get("configure", ""), p.get("write", ""),
                               p.get("read", ""))
    for p in data.get("policies", []):
        broker.put_policy(PolicyDef(p["vhost"], p["name"], p["pattern"], p.get("apply-to", "all"),
                                    int(p.get("priority", 0)), p.get("definition") or {}))
    for x in data.get("exchanges", []):
        vhost = broker.vhosts[x["vhost"]]
        if x["name"] not in vhost.exchanges:
            broker.add_exchange(Exchange(vhost.name, x["name"], x.get("type", "direct"),
                                         bool(x.get("durable", True)),
                                         bool(x.get("auto_delete", False)),
                                         bool(x.get("internal", False)),
                                         x.get("arguments") or {}))
    for q in data.get("queues", []):
        vhost = broker.vhosts[q["vhost"]]
        if q["name"] not in vhost.queues:
            broker.create_queue(vhost, q["name"], bool(q.get("durable", True)), None,
                                bool(q.get("auto_delete", False)), q.get("arguments") or {})
    for b in data.get("bindings", []):
        vhost = broker.vhosts[b["vhost"]]
        source = vhost.exchanges.get(b["source"])
        kind = QUEUE if b.get("destination_type", "queue") == "queue" else EXCHANGE
        targets = vhost.queues if kind == QUEUE else vhost.exchanges
        if source is not None and source.name and b["destination"] in targets:
            broker.bind(source, (kind, b["destination"]), b.get("routing_key", ""),
                        b.get("arguments") or {})
