"""Where messages go: /api/queues (with purge, and get through messages.py),
/api/exchanges (with publish), /api/bindings, each declared and deleted with the
AMQP permission the same change over AMQP needs."""

from __future__ import annotations

from warren.shards import records as r
from warren.storage.queuespec import QueueSpec

from ..amqp import spec
from ..broker import rules
from ..broker.exchange import EXCHANGE, QUEUE, Exchange
from ..errors import AMQPError
from . import messages, shapes
from .http import HTTPError, Request, Response, arguments, check_name, flag, not_found
from .listing import listed

# How RabbitMQ's management API answers a declaration refused for an AMQP reason
# (gateway.declare): the AMQP text, without its reply name, is the reason.
_REFUSALS = {spec.NOT_FOUND: (404, "not_found"), spec.ACCESS_REFUSED: (401, "not_authorised")}


def refused(error: AMQPError) -> HTTPError:
    status, kind = _REFUSALS.get(error.code, (400, "bad_request"))
    return HTTPError(status, kind, error.detail)


# -- queues -----------------------------------------------------------------------------

async def queues(management, request: Request, rest: list[str]) -> Response:
    vhosts = management.vhosts_in(request, rest)
    if len(rest) <= 1:
        figures = await management.sampler.queue_figures()
        return listed(request, [
            _queue(management, meta, figures.get(meta.qid))
            for vhost in vhosts for _, meta in sorted(vhost.queues.items())])
    vhost = vhosts[0]
    name = rest[1]
    if rest[2:] == ["get"]:
        return await messages.get(management.gateway, request, vhost, name)
    meta = vhost.queues.get(name)
    if rest[2:] == ["contents"]:
        if meta is None:
            raise not_found()
        management.check_permission(request, vhost, "read", QUEUE, name)
        await management.shard_request(meta, lambda req: r.PurgeQueue(req, meta.qid))
        return Response(204)
    if request.method == "GET":
        cluster = management.gateway.cluster
        # RabbitMQ lists a queue whose home node is down, but does not find it by name
        if meta is None or (cluster is not None and not cluster.members.is_up(meta.shard)):
            raise not_found()
        figures = await management.sampler.queue_figures()
        queue = _queue(management, meta, figures.get(meta.qid))
        management.sampler.add_samples(request, [("queue", meta.qid)], queue,
                                       queue["message_stats"], shapes.QUEUE_STATS)
        return Response.json(queue)
    if request.method == "PUT":
        check_name("queue", name)
        management.check_permission(request, vhost, "configure", QUEUE, name)
        body = request.json()
        queue = QueueSpec(vhost.name, name, flag(body, "durable", True), False,
                          flag(body, "auto_delete", False), arguments(body))
        try:
            _, created = rules.declare_queue(management.gateway.catalogue, queue,
                                             allow=management.allow_for(request, vhost))
        except AMQPError as error:
            raise refused(error) from None
        return Response(201 if created else 204)
    if meta is None:  # DELETE
        raise not_found()
    management.check_permission(request, vhost, "configure", QUEUE, name)
    await management.shard_request(meta, lambda req: r.DeleteQueue(
        req, meta.qid, request.query.get("if-unused") == "true",
        request.query.get("if-empty") == "true"))
    management.gateway.forget_queue(meta)
    return Response(204)


async def queue_bindings(management, request: Request, rest: list[str]) -> Response:
    """GET /api/queues/{vhost}/{queue}/bindings: those to the queue, the default
    exchange's first."""
    vhost = management.vhost_named(request, rest[0])
    if rest[1] not in vhost.queues:
        raise not_found()
    return listed(request, [b for b in shapes.bindings_of(vhost)
                            if b["destination_type"] == "queue"
                            and b["destination"] == rest[1]])


def _queue(management, meta, figure: dict | None) -> dict:
    figure = figure or {}
    ready, unacked = figure.get("ready", 0), figure.get("unacked", 0)
    policy = meta.policy
    shown = {
        "name": meta.spec.name, "vhost": meta.spec.vhost, "durable": meta.spec.durable,
        "auto_delete": meta.spec.auto_delete, "exclusive": meta.spec.exclusive,
        "arguments": meta.spec.arguments, "type": meta.spec.queue_type,
        "node": management.node_of(meta),
        "state": ("running" if figure else
                  "crashed" if meta.shard in management.gateway.shards.failing else "down"),
        "shard": meta.shard,
        "messages": ready + unacked, "messages_ready": ready,
        "messages_unacknowledged": unacked, "consumers": figure.get("consumers", 0),
        "message_bytes_ram": figure.get("ram_bytes", 0),
        "policy": policy.name if policy else None,
        "effective_policy_definition": policy.definition if policy else {},
        "effective_arguments": meta.effective,
        "exclusive_consumer_tag": None,
        "message_stats": shapes.message_stats([figure]) if figure else {},
    }
    group = management.replica_group(meta)
    if group is not None:  # a replicated quorum queue: it is where its leader is
        shown.update(group)
        shown["node"] = group["leader"]
        if group["leader"] is None:  # as RabbitMQ shows one with no leader at all
            shown["state"] = shown["messages"] = None
    if meta.spec.queue_type == "stream":  # its log's segments and their bytes on disk
        shown["segments"] = figure.get("segments", 0)
        shown["disk_bytes"] = figure.get("disk_bytes", 0)
    return shown


# -- exchanges and bindings -----------------------------------------------------------------

async def exchanges(management, request: Request, rest: list[str]) -> Response:
    gateway = management.gateway
    vhosts = management.vhosts_in(request, rest)
    if len(rest) <= 1:
        return listed(request, [shapes.exchange(x) for vhost in vhosts
                                for _, x in sorted(vhost.exchanges.items())])
    vhost = vhosts[0]
    name = rest[1]
    if rest[2:] == ["publish"]:
        return await messages.publish(gateway, request, vhost, name)
    exchange = vhost.exchanges.get(name)
    if request.method == "GET":
        if exchange is None:
            raise not_found()
        return Response.json(shapes.exchange(exchange))
    if request.method == "PUT":
        check_name("exchange", name)
        management.check_permission(request, vhost, "configure", EXCHANGE, name)
        body = request.json({"type": str})
        try:
            _, created = rules.declare_exchange(gateway.catalogue, Exchange(
                vhost.name, name, body.get("type", "direct"), flag(body, "durable", True),
                flag(body, "auto_delete", False), flag(body, "internal", False),
                arguments(body)), management.allow_for(request, vhost))
        except AMQPError as error:
            raise refused(error) from None
        return Response(201 if created else 204)
    if exchange is None:  # DELETE
        raise not_found()
    if name == "" or name.startswith("amq."):
        raise HTTPError(403, "access_refused", f"cannot delete exchange '{name}'")
    management.check_permission(request, vhost, "configure", EXCHANGE, name)
    gateway.delete_exchange(exchange)
    return Response(204)


async def exchange_bindings(management, request: Request, rest: list[str]) -> Response:
    """GET /api/exchanges/{vhost}/{exchange}/bindings/source|destination: those
    from the exchange, or to it."""
    vhost = management.vhost_named(request, rest[0])
    if rest[1] not in vhost.exchanges:
        raise not_found()
    if rest[3] == "source":
        found = [b for b in shapes.bindings_of(vhost) if b["source"] == rest[1]]
    else:
        found = [b for b in shapes.bindings_of(vhost) if b["destination_type"] == EXCHANGE
                 and b["destination"] == rest[1]]
    return listed(request, found)


async def bindings(management, request: Request, rest: list[str]) -> Response:
    vhosts = management.vhosts_in(request, rest)
    if len(rest) <= 1:
        return listed(request, [b for vhost in vhosts for b in shapes.bindings_of(vhost)])
    # /api/bindings/{vhost}/e/{source}/q|e/{destination}[/{properties_key}]
    vhost = vhosts[0]
    source_name, destination = rest[2], (QUEUE if rest[3] == "q" else EXCHANGE, rest[4])
    if request.method == "GET":  # the bindings between the two, or the one
        if source_name not in vhost.exchanges or destination[1] not in (
                vhost.queues if destination[0] == QUEUE else vhost.exchanges):
            raise not_found()
        found = [b for b in shapes.bindings_of(vhost) if b["source"] == source_name
                 and (b["destination_type"], b["destination"]) == destination
                 and rest[5:] in ([], [b["properties_key"]])]
        if len(rest) == 5:
            return listed(request, found)
        if not found:
            raise not_found()
        return Response.json(found[0])
    if request.method == "POST":
        body = request.json({"routing_key": str})
        try:
            rules.binding_ends(management.gateway.catalogue, vhost.name, source_name, destination)
            management.check_permission(request, vhost, "write", *destination)
            management.check_permission(request, vhost, "read", EXCHANGE, source_name)
            rules.bind(management.gateway.catalogue, vhost.name, source_name, destination,
                       body.get("routing_key", ""), arguments(body))
        except AMQPError as error:
            raise refused(error) from None
        return Response(201)
    source = vhost.exchanges.get(source_name)  # DELETE
    found = [(key, args) for (to, key, _), args in
             (source.bindings.items() if source is not None else ())
             if to == destination and shapes.properties_key(key, args) == rest[5]]
    if not found:
        raise not_found()
    management.check_permission(request, vhost, "write", *destination)
    management.check_permission(request, vhost, "read", EXCHANGE, source_name)
    management.gateway.unbind(source, destination, *found[0])
    return Response(204)
