"""The management HTTP API: RabbitMQ's management-plugin JSON for what Warren
has, on the gateway's event loop. Management dispatches each request to its
handler (routes.py names it; the handlers, by concern, are functions of
(management, request, rest) in overview, users, topology, connections,
parameters, limits, definitions and health) and holds what they share: what a
user sees, the node's processes, and the Sampler of figures and rates."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from warren.shards import records as r

from ..errors import AMQPError, refusal_error
from . import (
    connections,
    definitions,
    health,
    limits,
    login,
    metrics,
    overview,
    parameters,
    quorum,
    routes,
    shapes,
    static,
    topology,
    users,
)
from .http import HTTPError, Request, Response, bad_request, not_authorised, not_found
from .rights import is_admin, is_monitor, require_monitor
from .sampling import Sampler

# routes.py's handler names: what serves each
HANDLERS = {
    "overview": overview.overview, "cluster_name": overview.cluster_name,
    "extensions": overview.extensions, "whoami": overview.whoami, "nodes": overview.nodes,
    "vhosts": users.vhosts, "vhost_permissions": users.vhost_permissions,
    "vhost_topic_permissions": users.vhost_topic_permissions, "users": users.users,
    "user_permissions": users.user_permissions,
    "user_topic_permissions": users.user_topic_permissions,
    "permissions": users.permissions, "topic_permissions": users.topic_permissions,
    "queues": topology.queues, "queue_bindings": topology.queue_bindings,
    "exchanges": topology.exchanges, "exchange_bindings": topology.exchange_bindings,
    "bindings": topology.bindings,
    "connections": connections.connections,
    "connection_channels": connections.connection_channels,
    "vhost_connections": connections.vhost_connections,
    "vhost_channels": connections.vhost_channels, "channels": connections.channels,
    "consumers": connections.consumers,
    "policies": parameters.policies, "operator_policies": parameters.operator_policies,
    "parameters": parameters.parameters,
    "vhost_limits": limits.vhost_limits, "user_limits": limits.user_limits,
    "definitions": definitions.definitions,
    "aliveness_test": health.aliveness_test, "healthchecks": health.healthchecks,
    "health": health.health, "quorum_status": quorum.quorum_status,
    "quorum_members": quorum.quorum_members, "quorum_grow": quorum.quorum_grow,
    "quorum_shrink": quorum.quorum_shrink,
}


# Routes whose PUT, POST and DELETE change the catalogue (but for what they do
# with messages: get, purge, publish).
CATALOGUE = {"vhosts", "users", "permissions", "policies", "definitions", "vhost_limits",
             "user_limits", "cluster_name", "queues", "exchanges", "bindings"}
MESSAGES = ("get", "contents", "publish")


class Management:
    def __init__(self, gateway, listeners: list[dict] | None = None):
        self.gateway = gateway
        self.started = time.time()
        self.listeners = listeners or []
        self.sampler = Sampler(gateway, self.connections)

    # -- dispatch ------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        served = static.serve(request)  # the dashboard's page and files
        if served is not None:
            return served
        if self.gateway.followers is not None:  # the other gateways' connections, now
            await self.gateway.followers.list_connections()
        parts = request.parts
        if parts in (["metrics"], ["metrics", "per-object"]):  # as rabbitmq_prometheus
            if self.gateway.config.prometheus_authentication:  # its authentication.enabled
                await login.log_in(self.gateway.access, request)
                require_monitor(request)
            return Response(200, await metrics.render(self, per_object=len(parts) == 2),
                            metrics.CONTENT_TYPE_LATEST)
        if parts[0] != "api":
            raise not_found()
        asked = request.method
        if asked == "HEAD":  # a GET whose answer aiohttp sends without its body
            request.method = "GET"
        try:
            name = routes.match(parts[1:], request.method)
        except routes.NotServed as unserved:
            if not unserved.allowed:
                raise not_found() from None
            allow = {"Allow": routes.allow_header(unserved.allowed)}
            if asked == "OPTIONS":  # as RabbitMQ's, without credentials (CORS preflights)
                return Response(200, headers=allow)
            raise HTTPError(405, "", "", allow) from None  # as RabbitMQ's: no body
        await login.authenticate(self.gateway.access, request)
        cluster = self.gateway.cluster
        if cluster is not None and name in CATALOGUE and parts[-1] not in MESSAGES \
                and request.method in ("PUT", "POST", "DELETE"):
            refusal = cluster.refusal()
            if refusal is not None:
                raise HTTPError(503, "service_unavailable", refusal.detail)
        response = await HANDLERS[name](self, request, parts[2:])
        if cluster is not None and not cluster.caught_up():
            # answered once etcd has it, as a client's declaration is
            outcome = await cluster.committed()
            if isinstance(outcome, AMQPError):
                raise HTTPError(503, "service_unavailable", outcome.detail)
        if self.gateway.followers is not None:  # what it changed is on every gateway first
            await self.gateway.followers.applied_everywhere()
        return response

    # -- the shards and the node ----------------------------------------------------

    async def shard_request(self, meta, make) -> r.Reply:
        """The reply of the shard of queue `meta` to the request `make` builds; 400
        with the refusal's text when the shard refuses it."""
        future = asyncio.get_running_loop().create_future()
        self.gateway.shards[meta.shard].request(make, lambda reply: future.done()
                                                or future.set_result(reply))
        reply = await asyncio.wait_for(future, 10.0)
        if reply.refused:
            raise bad_request(refusal_error(reply.refused, meta.spec.vhost, meta.spec.name).text)
        return reply

    def node_of(self, meta) -> str:
        """The node a queue lives on."""
        cluster = self.gateway.cluster
        return cluster.node_of(meta) if cluster is not None else shapes.NODE

    def replica_group(self, meta) -> dict | None:
        """A replicated quorum queue's leader, members and online members."""
        cluster = self.gateway.cluster
        return cluster.replicas.shown(meta.qid) if cluster is not None else None

    def cluster_name(self) -> str:
        return self.gateway.catalogue.meta.cluster_name() or shapes.NODE

    def pids(self) -> list[int]:
        """The broker's processes: the gateway and its running shards."""
        return [os.getpid(), *self.shard_pids().values()]

    def shard_pids(self) -> dict[int, int]:
        return {link.index: link.process.pid for link in self.gateway.shards
                if link.process is not None and link.process.poll() is None}

    def permanent_id(self) -> str:
        """A name for this broker that outlives restarts and renames (its data
        directory's), as RabbitMQ's cluster_permanent_id."""
        digest = hashlib.sha1(os.path.abspath(self.gateway.data_dir).encode()).hexdigest()
        return f"warren-cluster-id-{digest[:22]}"

    # -- what a user sees ----------------------------------------------------------------

    def permitted_vhosts(self, request: Request) -> list[str]:
        """The vhosts whose queues, exchanges, bindings and policies a user sees:
        all for administrators, the ones it has permissions on for the others
        (monitoring users too)."""
        names = sorted(self.gateway.catalogue.vhosts)
        if is_admin(request.user):
            return names
        return [v for v in names if self.gateway.access.may_use_vhost(request.user.name, v)]

    def vhost_named(self, request: Request, name: str):
        """The vhost `name`: 404 when there is none, 401 when the user may not use it."""
        vhost = self.gateway.catalogue.vhosts.get(name)
        if vhost is None:
            raise not_found()
        if not is_admin(request.user) and not self.gateway.access.may_use_vhost(
                request.user.name, name):
            raise not_authorised("User not authorised to access virtual host")
        return vhost

    def vhosts_in(self, request: Request, rest: list[str]) -> list:
        """The vhost a path names (rest[0]), or all the user sees when it names none."""
        if rest:
            return [self.vhost_named(request, rest[0])]
        return [self.gateway.catalogue.vhosts[name] for name in self.permitted_vhosts(request)]

    def check_permission(self, request: Request, vhost, access: str, kind: str,
                         name: str) -> None:
        """A change through the API needs the AMQP permission the same change over
        AMQP would (RabbitMQ makes it over an internal AMQP connection)."""
        try:
            self.gateway.access.check(request.user.name, vhost.name, access, kind, name)
        except AMQPError:
            raise not_authorised("Access refused.") from None

    def allow_for(self, request: Request, vhost):
        """check_permission for declare's checks of where a new queue or exchange
        sends messages."""
        return lambda access, kind, name: self.check_permission(request, vhost, access, kind,
                                                                name)

    def connections(self) -> list:
        """Every open connection of the broker: this gateway's and the others'."""
        local = [c for c in self.gateway.registry.connections if c.vhost is not None]
        followers = self.gateway.followers
        return local if followers is None else local + followers.connections()

    def visible_connections(self, request: Request) -> list:
        """Monitors see every client connection, the others their own."""
        if is_monitor(request.user):
            return self.connections()
        return [c for c in self.connections() if c.user == request.user.name]

    def snapshots(self, request: Request) -> list:
        """Typed snapshots of the connections the user may see."""
        return [c.snapshot() for c in self.visible_connections(request)]

