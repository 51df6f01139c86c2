"""The management HTTP API: RabbitMQ's management-plugin JSON for what Warren
has, on the gateway's event loop. Management holds what every handler shares:
who asks and what they may see, the queue figures from the shards (QueueInfo),
and the rates, the change between two samples. The handlers, by concern, are
functions of (management, request, rest) in overview, users, topology,
connections, parameters, limits, definitions and health; routes.py names which
one serves each path."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time

from warren.gateway.errors import AMQPError, refusal_error
from warren.shards import records as r

from . import (
    connections,
    definitions,
    health,
    limits,
    metrics,
    overview,
    parameters,
    routes,
    static,
    topology,
    users,
)
from .history import History, add_samples, kept_values
from .http import HTTPError, Request, Response, bad_request, not_authorised, not_found
from .rates import SAMPLE_INTERVAL, Rates
from .rights import MANAGEMENT_TAGS, is_admin, is_monitor, require_monitor
from .shapes import NODE

log = logging.getLogger("warren.management")

COUNTED = ("published", "delivered", "redelivered", "acked")  # per queue, with rates

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
    "health": health.health,
}


class Management:
    def __init__(self, gateway, listeners: list[dict] | None = None):
        self.gateway = gateway
        self.started = time.time()
        self.listeners = listeners or []
        self.rates = Rates(time.monotonic())
        self.history = History()  # what the charts show at once
        self.shard_fsyncs: dict[int, tuple[int, int]] = {}  # shard -> (fsyncs, messages)
        self.sampler: asyncio.Task | None = None  # keep_sampling, from listener.start

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
                await self.log_in(request)
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
        await self.authenticate(request)
        response = await HANDLERS[name](self, request, parts[2:])
        if self.gateway.followers is not None:  # what it changed is on every gateway first
            await self.gateway.followers.applied_everywhere()
        return response

    # -- figures from the shards -----------------------------------------------------

    async def queue_figures(self) -> dict[int, dict]:
        """Per qid: ready, unacked, consumers, bytes, counters, and their rates."""
        figures = await self._queue_info()
        now = time.monotonic()
        for qid, values in figures.items():
            values["rates"] = self.rates.rate(("queue", qid), now,
                                              {name: values[name] for name in COUNTED})
        return figures

    async def _queue_info(self) -> dict[int, dict]:
        """Per qid, the shards' QueueInfo fields (a shard that is down or does not
        answer within 2 s leaves its queues out)."""
        loop = asyncio.get_running_loop()
        futures = []
        for link in self.gateway.shards:
            future = loop.create_future()
            futures.append((link.index, future))
            link.request(lambda req: r.QueueInfo(req, []),
                         lambda reply, f=future: f.done() or f.set_result(reply))
        figures: dict[int, dict] = {}
        for index, future in futures:
            try:
                reply = await asyncio.wait_for(future, 2.0)
            except TimeoutError:
                continue
            if type(reply) is not r.QueueInfoReply:
                continue  # the shard is down
            self.shard_fsyncs[index] = (reply.fsyncs, reply.messages)
            for entry in reply.queues:
                values = dict(zip(r.QUEUE_INFO_FIELDS, entry))
                figures[values["qid"]] = values
        return figures

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

    async def sample(self) -> None:
        """Take one sample of every counter a rate is shown for."""
        figures = await self._queue_info()
        counters: dict = {("queue", qid): {name: values[name] for name in COUNTED}
                          for qid, values in figures.items()}
        counters["totals"] = self.gateway.broker_totals()
        for info in (c.snapshot() for c in self.connections()):
            counters[("connection", info.name)] = _traffic(info)
        self.rates.sample(time.monotonic(), counters)
        now = time.time()
        if self.history.due(now, SAMPLE_INTERVAL):
            vhost_of = {meta.qid: name for name, vhost in self.gateway.catalogue.vhosts.items()
                        for meta in vhost.queues.values()}
            self.history.record(now, kept_values(figures, counters["totals"], vhost_of))

    async def keep_sampling(self) -> None:
        # Until cancelled (at exit), even when Python 3.11's wait_for swallows the
        # cancel because a shard answered at the same moment: asked once, it stops.
        task = asyncio.current_task()
        while not task.cancelling():
            try:
                await self.sample()
            except Exception:  # never stop sampling over one bad turn
                log.exception("sampling the broker's counters failed")
            await asyncio.sleep(SAMPLE_INTERVAL)

    def connection_rates(self, info) -> dict:
        return self.rates.rate(("connection", info.name), time.monotonic(), _traffic(info))

    def totals_rates(self) -> dict:
        return self.rates.rate("totals", time.monotonic(), self.gateway.broker_totals())

    def add_samples(self, request: Request, keys, lengths: dict, stats: dict,
                    stat_fields) -> None:
        """The history ?lengths_age=&lengths_incr=&msg_rates_age=&msg_rates_incr= ask for."""
        try:
            add_samples(request.query, self.history, keys, time.time(), lengths, stats,
                        stat_fields)
        except ValueError as error:
            raise bad_request(str(error)) from None

    # -- the node -------------------------------------------------------------------------

    def cluster_name(self) -> str:
        return self.gateway.catalogue.meta.cluster_name() or NODE

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

    # -- authentication ----------------------------------------------------------------

    async def authenticate(self, request: Request) -> None:
        await self.log_in(request)
        if MANAGEMENT_TAGS.isdisjoint(request.user.tags):
            raise not_authorised("Not management user")

    async def log_in(self, request: Request) -> None:
        """Set request.user from the credentials, or 401. A login from an address
        the broker throttles waits its turn before its password is checked, as an
        AMQP one does; a refusal is answered after the throttle's delay. The loop
        serves everyone else meanwhile."""
        credentials = request.credentials()
        # Browsers answer a challenge with a password dialog: the dashboard signs in
        # with its own form, so its requests (X-Requested-With) get none.
        challenge = ({} if "x-requested-with" in request.headers
                     else {"WWW-Authenticate": 'Basic realm="Warren management"'})
        if credentials is None:
            raise HTTPError(401, "not_authorised", "Not_Authorized", challenge)
        name, password = credentials
        access, peer = self.gateway.access, request.peer
        at_turn, waited = False, 0.0
        if access.must_wait(peer):
            wait = await _answer(lambda answered: access.login_turn(peer, answered))
            if wait is None:  # its turn is too far off: refused unchecked, as slowly
                delay = access.throttle.cap
                log.warning("HTTP access denied: user '%s' - too many failed logins (from "
                            "%s, answered in %gs)", name, peer, delay)
                await asyncio.sleep(delay)
                raise HTTPError(401, "not_authorised", "Login failed", challenge)
            await asyncio.sleep(wait)
            at_turn, waited = True, wait
        reason = access.refusal(name, password, peer)
        if reason is None:
            request.user = access.users[name]
            return
        delay = await _answer(lambda answered: access.login_failed(
            name, reason, peer, "HTTP", at_turn, waited, answered))
        await asyncio.sleep(delay or 0.0)
        raise HTTPError(401, "not_authorised", "Login failed", challenge)

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


async def _answer(ask):
    """What `ask(answered)` passes to `answered`, now or later (from the root)."""
    answer = asyncio.get_running_loop().create_future()
    ask(lambda value: answer.done() or answer.set_result(value))
    return await answer


def _traffic(info) -> dict[str, int]:
    """A connection's byte counters that rates are shown for."""
    return {"recv_oct": info.recv_oct, "send_oct": info.send_oct}
