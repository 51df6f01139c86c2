"""The management HTTP API: RabbitMQ's management-plugin JSON for what Warren
has, on the gateway's event loop. Queue figures come from the shards
(QueueInfo); rates are the change between two samples."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time

from warren.gateway import __version__
from warren.gateway.amqp import spec
from warren.gateway.broker import patterns, policies, rules
from warren.gateway.broker.exchange import EXCHANGE, EXCHANGE_TYPES, QUEUE, Exchange
from warren.gateway.errors import AMQPError, refusal_error
from warren.shards import records as r
from warren.storage.metastore import PolicyDef
from warren.storage.queuespec import QueueSpec

from . import definitions, health, limits, messages, metrics, routes, shapes, static
from .history import History, add_samples, kept_values
from .http import HTTPError, Request, Response, bad_request, check_name
from .listing import listing
from .rates import SAMPLE_INTERVAL, Rates
from .shapes import NODE

log = logging.getLogger("warren.management")

COMPATIBLE_RABBITMQ = "3.13.7"  # the management API version Warren's JSON follows
MANAGEMENT_TAGS = {"management", "policymaker", "monitoring", "administrator"}


def not_found() -> HTTPError:
    return HTTPError(404, "Object Not Found", "Not Found")


def not_authorised(reason: str) -> HTTPError:
    return HTTPError(401, "not_authorised", reason)


# RabbitMQ's user tags, each including the rights of "management": policymakers
# also manage their vhosts' policies; monitors also see every vhost, connection and
# channel and the node; administrators can do anything.
def is_admin(user) -> bool:
    return "administrator" in user.tags


def is_monitor(user) -> bool:
    return "monitoring" in user.tags or is_admin(user)


def is_policymaker(user) -> bool:
    return "policymaker" in user.tags or is_admin(user)


# How RabbitMQ's management API answers a declaration refused for an AMQP reason
# (gateway.declare): the AMQP text, without its reply name, is the reason.
_REFUSALS = {spec.NOT_FOUND: (404, "not_found"), spec.ACCESS_REFUSED: (401, "not_authorised")}


def refused(error: AMQPError) -> HTTPError:
    status, kind = _REFUSALS.get(error.code, (400, "bad_request"))
    return HTTPError(status, kind, error.detail)


def flag(body: dict, name: str, default: bool) -> bool:
    """A boolean field: true or false, or "true" or "false" as rabbitmqadmin sends."""
    value = body.get(name, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise bad_request(f"{name} must be a boolean")


def arguments(body: dict) -> dict:
    """The arguments field: an object, or an empty array for none, as pyrabbit2
    sends and RabbitMQ takes."""
    value = body.get("arguments", {})
    if value == []:
        return {}
    if not isinstance(value, dict):
        raise bad_request("arguments must be an object")
    return value


class Management:
    def __init__(self, gateway, listeners: list[dict] | None = None):
        self.gateway = gateway
        self.started = time.time()
        self.listeners = listeners or []
        self.rates = Rates(time.monotonic())
        self.history = History()  # what the charts show at once
        self.compatible_version = COMPATIBLE_RABBITMQ
        self.shard_fsyncs: dict[int, tuple[int, int]] = {}  # shard -> (fsyncs, messages)

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
            vhost_of = {meta.qid: name for name, vhost in self.gateway.vhosts.items()
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

    # What each tag may do, as RabbitMQ's management plugin decides it (its 401s).

    @staticmethod
    def require_admin(request: Request) -> None:
        if not is_admin(request.user):
            raise not_authorised("Not administrator user")

    @staticmethod
    def require_monitor(request: Request) -> None:
        if not is_monitor(request.user):
            raise not_authorised("Not monitor user")

    def permitted_vhosts(self, request: Request) -> list[str]:
        """The vhosts whose queues, exchanges, bindings and policies a user sees:
        all for administrators, the ones it has permissions on for the others
        (monitoring users too)."""
        names = sorted(self.gateway.vhosts)
        if is_admin(request.user):
            return names
        return [v for v in names if self.gateway.access.may_use_vhost(request.user.name, v)]

    def _vhost_named(self, request: Request, name: str):
        vhost = self.gateway.vhosts.get(name)
        if vhost is None:
            raise not_found()
        if not is_admin(request.user) and not self.gateway.access.may_use_vhost(
                request.user.name, name):
            raise not_authorised("User not authorised to access virtual host")
        return vhost

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

    def visible_connections(self, request: Request) -> list:
        """Monitors see every client connection, the others their own."""
        if is_monitor(request.user):
            return self.connections()
        return [c for c in self.connections() if c.user == request.user.name]

    @staticmethod
    def listed(request: Request, items: list[dict]) -> Response:
        """A list endpoint's answer, filtered, sorted, paged and cut to columns as
        the query asks."""
        return Response.json(listing(items, request.query))

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
                self.require_monitor(request)
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
        response = await getattr(self, f"api_{name}")(request, parts[2:])
        if self.gateway.followers is not None:  # what it changed is on every gateway first
            await self.gateway.followers.applied_everywhere()
        return response

    # -- overview and nodes ----------------------------------------------------------------

    async def api_overview(self, request: Request, rest: list[str]) -> Response:
        figures = await self.queue_figures()
        gateway = self.gateway
        # Monitors see global totals, the node and its listeners; the others totals
        # of their vhosts and connections.
        monitor = is_monitor(request.user)
        vhosts = (list(gateway.vhosts.values()) if monitor else
                  [gateway.vhosts[name] for name in self.permitted_vhosts(request)])
        queues = [meta.qid for vhost in vhosts for meta in vhost.queues.values()]
        figures = [figures[qid] for qid in queues if qid in figures]
        connections = self.snapshots(request)
        ready = sum(f["ready"] for f in figures)
        unacked = sum(f["unacked"] for f in figures)
        overview = {
            "management_version": COMPATIBLE_RABBITMQ,
            "rabbitmq_version": COMPATIBLE_RABBITMQ,
            "product_name": "Warren", "product_version": __version__,
            "erlang_version": "none (Python)", "cluster_name": self.cluster_name(),
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
            "message_stats": (self._global_stats() if monitor
                              else shapes.message_stats(figures)),
        }
        if monitor:
            overview["node"] = NODE
            overview["listeners"] = self.listeners
            overview["contexts"] = [{"node": NODE, "description": "Warren management",
                                     "path": "/", "port": str(listener["port"])}
                                    for listener in self.listeners
                                    if listener["protocol"] in ("http", "https")]
            overview["object_totals"]["consumers"] = sum(
                len(ch.consumers) for c in connections for ch in c.channels)
        self.add_samples(request, ["totals"] if monitor else [("vhost", v.name) for v in vhosts],
                         overview["queue_totals"], overview["message_stats"],
                         GLOBAL_STATS if monitor else shapes.QUEUE_STATS)
        return Response.json(overview)

    def _global_stats(self) -> dict:
        totals, rates = self.gateway.broker_totals(), self.totals_rates()
        stats = {}
        for name, key in GLOBAL_STATS:
            stats[name] = totals[key]
            stats[f"{name}_details"] = {"rate": round(rates[key], 1)}
        return stats

    def add_samples(self, request: Request, keys, lengths: dict, stats: dict,
                    stat_fields) -> None:
        """The history ?lengths_age=&lengths_incr=&msg_rates_age=&msg_rates_incr= ask for."""
        try:
            add_samples(request.query, self.history, keys, time.time(), lengths, stats,
                        stat_fields)
        except ValueError as error:
            raise bad_request(str(error)) from None

    def cluster_name(self) -> str:
        return self.gateway.meta.cluster_name() or NODE

    async def api_cluster_name(self, request: Request, rest: list[str]) -> Response:
        if request.method == "GET":
            return Response.json({"name": self.cluster_name()})
        self.require_admin(request)  # PUT
        name = request.json({"name": str}).get("name")
        if not name:
            raise bad_request("name is required")
        self.gateway.meta.set_cluster_name(name)
        return Response(204)

    async def api_extensions(self, request: Request, rest: list[str]) -> Response:
        """The management UI's plugins: none; the dashboard is one page."""
        return Response.json([])

    async def api_nodes(self, request: Request, rest: list[str]) -> Response:
        self.require_monitor(request)
        node = self._node()
        if rest:
            if rest[0] != NODE:
                raise not_found()
            return Response.json(node)
        return self.listed(request, [node])

    def _node(self) -> dict:
        gateway = self.gateway
        pids = self.pids()
        return {
            "name": NODE, "type": "disc", "running": True,
            "mem_used": sum(metrics.rss(pid) for pid in pids),
            "mem_limit": gateway.config.memory_limit_bytes(),
            "mem_alarm": gateway.alarms.on("memory"),
            "disk_free": gateway.alarms.disk_free,
            "disk_free_limit": gateway.alarms.disk_free_limit,
            "disk_free_alarm": gateway.alarms.on("disk"),
            "fd_used": len(os.listdir("/proc/self/fd")),
            "proc_used": len(pids), "processors": os.cpu_count(),
            "uptime": int((time.time() - self.started) * 1000),
            "partitions": [], "run_queue": 0,
            "shards": gateway.shards.count,
            "failing_shards": _failing_shards(gateway),
        }

    def pids(self) -> list[int]:
        """The broker's processes: the gateway and its running shards."""
        return [os.getpid(), *self.shard_pids().values()]

    def permanent_id(self) -> str:
        """A name for this broker that outlives restarts and renames (its data
        directory's), as RabbitMQ's cluster_permanent_id."""
        digest = hashlib.sha1(os.path.abspath(self.gateway.data_dir).encode()).hexdigest()
        return f"warren-cluster-id-{digest[:22]}"

    def shard_pids(self) -> dict[int, int]:
        return {link.index: link.process.pid for link in self.gateway.shards
                if link.process is not None and link.process.poll() is None}

    # -- vhosts, users, permissions ---------------------------------------------------------

    async def api_vhosts(self, request: Request, rest: list[str]) -> Response:
        gateway = self.gateway
        if not rest:
            names = sorted(gateway.vhosts) if is_monitor(request.user) \
                else self.permitted_vhosts(request)
            return self.listed(request, [self._vhost(name) for name in names])
        self.require_admin(request)
        name = rest[0]
        if request.method == "GET":
            if name not in gateway.vhosts:
                raise not_found()
            return Response.json(self._vhost(name))
        if request.method == "PUT":
            check_name("vhost", name)
            body = request.json({"description": str})
            created = name not in gateway.vhosts
            gateway.add_vhost(name, body.get("description", ""),
                             (gateway.vhost_defs.get(name).limits if not created else {}))
            if created:  # as RabbitMQ's: its creator may use it at once
                gateway.access.grant_creator(request.user.name, name)
            return Response(201 if created else 204)
        if not gateway.delete_vhost(name):  # DELETE
            raise not_found()
        return Response(204)

    async def api_vhost_permissions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        if rest[0] not in self.gateway.vhosts:
            raise not_found()
        return self.listed(request, [shapes.permission(p) for (_, vhost), p in
                                     sorted(self.gateway.access.permissions.items())
                                     if vhost == rest[0]])

    async def api_vhost_topic_permissions(self, request: Request, rest: list[str]) -> Response:
        """None: Warren has no topic permissions (an import refuses them)."""
        self.require_admin(request)
        if rest[0] not in self.gateway.vhosts:
            raise not_found()
        return self.listed(request, [])

    async def api_vhost_connections(self, request: Request, rest: list[str]) -> Response:
        vhost = self._vhost_named(request, rest[0]).name
        return self.listed(request, [shapes.connection(info, self.connection_rates(info))
                                     for info in self.snapshots(request) if info.vhost == vhost])

    async def api_vhost_channels(self, request: Request, rest: list[str]) -> Response:
        vhost = self._vhost_named(request, rest[0]).name
        return self.listed(request, [shapes.channel(c, ch) for c in self.snapshots(request)
                                     if c.vhost == vhost for ch in c.channels])

    def _vhost(self, name: str) -> dict:
        definition = self.gateway.vhost_defs.get(name)
        return {"name": name, "description": definition.description if definition else "",
                "tags": [], "default_queue_type": "classic", "tracing": False,
                "limits": definition.limits if definition else {},
                "metadata": {"description": definition.description if definition else "",
                             "tags": []}}

    async def api_users(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)  # password hashes are for administrators' eyes
        access = self.gateway.access
        if not rest:
            return self.listed(request, [shapes.user(u)
                                         for _, u in sorted(access.users.items())])
        name = rest[0]
        if request.method == "GET":
            user = access.users.get(name)
            if user is None:
                raise not_found()
            return Response.json(shapes.user(user))
        if request.method == "PUT":
            check_name("user", name)
            body = request.json({"password": str, "password_hash": str, "tags": (str, list)})
            tags = body.get("tags", [])
            if isinstance(tags, str):
                tags = [t.strip() for t in tags.split(",") if t.strip()]
            elif not all(isinstance(t, str) for t in tags):
                raise bad_request("tags must be strings")
            password = body.get("password")
            password_hash = body.get("password_hash")
            if password is None and password_hash is None and name not in access.users:
                raise bad_request("password or password_hash is required")
            created = name not in access.users
            access.put_user(name, password, tags, password_hash)
            return Response(201 if created else 204)
        if not access.delete_user(name):  # DELETE
            raise not_found()
        for conn in [c for c in self.connections() if c.user == name]:
            conn.close_forced(f"user '{name}' is deleted")
        return Response(204)

    async def api_user_permissions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        access = self.gateway.access
        if rest[0] not in access.users:
            raise not_found()
        return self.listed(request, [shapes.permission(p) for (user, _), p in
                                     sorted(access.permissions.items()) if user == rest[0]])

    async def api_user_topic_permissions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        if rest[0] not in self.gateway.access.users:
            raise not_found()
        return self.listed(request, [])

    async def api_whoami(self, request: Request, rest: list[str]) -> Response:
        return Response.json({"name": request.user.name, "tags": request.user.tags})

    async def api_permissions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        access = self.gateway.access
        if not rest:
            return self.listed(request, [shapes.permission(p)
                                         for _, p in sorted(access.permissions.items())])
        vhost, user = rest
        if request.method == "GET":
            permission = access.permissions.get((user, vhost))
            if permission is None:
                raise not_found()
            return Response.json(shapes.permission(permission))
        if request.method == "PUT":
            if vhost not in self.gateway.vhosts or user not in access.users:
                raise not_found()
            body = request.json({"configure": str, "write": str, "read": str})
            values = [body.get(k, "") for k in ("configure", "write", "read")]
            for value in values:
                problem = patterns.problem(value)
                if problem:
                    raise bad_request(f"invalid regular expression '{value}': {problem}")
            access.set_permissions(user, vhost, *values)
            return Response(201)
        if not access.clear_permissions(user, vhost):  # DELETE
            raise not_found()
        return Response(204)

    # -- queues -----------------------------------------------------------------------------

    async def api_queues(self, request: Request, rest: list[str]) -> Response:
        vhosts = self._vhosts_in(request, rest)
        if len(rest) <= 1:
            figures = await self.queue_figures()
            return self.listed(request, [
                self._queue(meta, figures.get(meta.qid))
                for vhost in vhosts for _, meta in sorted(vhost.queues.items())])
        vhost = vhosts[0]
        name = rest[1]
        if rest[2:] == ["get"]:
            return await messages.get(self.gateway, request, vhost, name)
        meta = vhost.queues.get(name)
        if rest[2:] == ["contents"]:
            if meta is None:
                raise not_found()
            self.check_permission(request, vhost, "read", QUEUE, name)
            await self._shard_request(meta, lambda req: r.PurgeQueue(req, meta.qid))
            return Response(204)
        if request.method == "GET":
            if meta is None:
                raise not_found()
            figures = await self.queue_figures()
            queue = self._queue(meta, figures.get(meta.qid))
            self.add_samples(request, [("queue", meta.qid)], queue, queue["message_stats"],
                             shapes.QUEUE_STATS)
            return Response.json(queue)
        if request.method == "PUT":
            check_name("queue", name)
            self.check_permission(request, vhost, "configure", QUEUE, name)
            body = request.json()
            queue = QueueSpec(vhost.name, name, flag(body, "durable", True), False,
                              flag(body, "auto_delete", False), arguments(body))
            try:
                _, created = rules.declare_queue(self.gateway, queue,
                                                   allow=self.allow_for(request, vhost))
            except AMQPError as error:
                raise refused(error) from None
            return Response(201 if created else 204)
        if meta is None:  # DELETE
            raise not_found()
        self.check_permission(request, vhost, "configure", QUEUE, name)
        await self._shard_request(meta, lambda req: r.DeleteQueue(
            req, meta.qid, request.query.get("if-unused") == "true",
            request.query.get("if-empty") == "true"))
        self.gateway.forget_queue(meta)
        return Response(204)

    async def api_queue_bindings(self, request: Request, rest: list[str]) -> Response:
        """GET /api/queues/{vhost}/{queue}/bindings: those to the queue, the default
        exchange's first."""
        vhost = self._vhost_named(request, rest[0])
        if rest[1] not in vhost.queues:
            raise not_found()
        return self.listed(request, [b for b in shapes.bindings_of(vhost)
                                     if b["destination_type"] == "queue"
                                     and b["destination"] == rest[1]])

    async def _shard_request(self, meta, make) -> r.Reply:
        future = asyncio.get_running_loop().create_future()
        self.gateway.shards[meta.shard].request(make, lambda reply: future.done()
                                              or future.set_result(reply))
        reply = await asyncio.wait_for(future, 10.0)
        if reply.refused:
            raise bad_request(refusal_error(reply.refused, meta.spec.vhost, meta.spec.name).text)
        return reply

    def _queue(self, meta, figure: dict | None) -> dict:
        figure = figure or {}
        ready, unacked = figure.get("ready", 0), figure.get("unacked", 0)
        policy = meta.policy
        return {
            "name": meta.spec.name, "vhost": meta.spec.vhost, "durable": meta.spec.durable,
            "auto_delete": meta.spec.auto_delete, "exclusive": meta.spec.exclusive,
            "arguments": meta.spec.arguments, "type": meta.spec.queue_type, "node": NODE,
            "state": ("running" if figure else
                      "crashed" if meta.shard in self.gateway.shards.failing else "down"),
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

    def _vhosts_in(self, request: Request, rest: list[str]) -> list:
        """The vhost a path names (rest[0]), or all the user sees when it names none."""
        if rest:
            return [self._vhost_named(request, rest[0])]
        return [self.gateway.vhosts[name] for name in self.permitted_vhosts(request)]

    # -- exchanges and bindings -----------------------------------------------------------------

    async def api_exchanges(self, request: Request, rest: list[str]) -> Response:
        gateway = self.gateway
        vhosts = self._vhosts_in(request, rest)
        if len(rest) <= 1:
            return self.listed(request, [shapes.exchange(x) for vhost in vhosts
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
            self.check_permission(request, vhost, "configure", EXCHANGE, name)
            body = request.json({"type": str})
            try:
                _, created = rules.declare_exchange(gateway, Exchange(
                    vhost.name, name, body.get("type", "direct"), flag(body, "durable", True),
                    flag(body, "auto_delete", False), flag(body, "internal", False),
                    arguments(body)), self.allow_for(request, vhost))
            except AMQPError as error:
                raise refused(error) from None
            return Response(201 if created else 204)
        if exchange is None:  # DELETE
            raise not_found()
        if name == "" or name.startswith("amq."):
            raise HTTPError(403, "access_refused", f"cannot delete exchange '{name}'")
        self.check_permission(request, vhost, "configure", EXCHANGE, name)
        gateway.delete_exchange(exchange)
        return Response(204)

    async def api_exchange_bindings(self, request: Request, rest: list[str]) -> Response:
        """GET /api/exchanges/{vhost}/{exchange}/bindings/source|destination: those
        from the exchange, or to it."""
        vhost = self._vhost_named(request, rest[0])
        if rest[1] not in vhost.exchanges:
            raise not_found()
        if rest[3] == "source":
            found = [b for b in shapes.bindings_of(vhost) if b["source"] == rest[1]]
        else:
            found = [b for b in shapes.bindings_of(vhost) if b["destination_type"] == EXCHANGE
                     and b["destination"] == rest[1]]
        return self.listed(request, found)

    async def api_bindings(self, request: Request, rest: list[str]) -> Response:
        vhosts = self._vhosts_in(request, rest)
        if len(rest) <= 1:
            return self.listed(request, [b for vhost in vhosts
                                         for b in shapes.bindings_of(vhost)])
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
                return self.listed(request, found)
            if not found:
                raise not_found()
            return Response.json(found[0])
        if request.method == "POST":
            body = request.json({"routing_key": str})
            try:
                rules.binding_ends(self.gateway, vhost.name, source_name, destination)
                self.check_permission(request, vhost, "write", *destination)
                self.check_permission(request, vhost, "read", EXCHANGE, source_name)
                rules.bind(self.gateway, vhost.name, source_name, destination,
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
        self.check_permission(request, vhost, "write", *destination)
        self.check_permission(request, vhost, "read", EXCHANGE, source_name)
        self.gateway.unbind(source, destination, *found[0])
        return Response(204)

    # -- connections, channels, consumers -------------------------------------------------------

    def connections(self) -> list:
        """Every open connection of the broker: this gateway's and the others'."""
        local = [c for c in self.gateway.connections if c.vhost is not None]
        followers = self.gateway.followers
        return local if followers is None else local + followers.connections()

    async def api_connections(self, request: Request, rest: list[str]) -> Response:
        if not rest:
            return self.listed(request, [shapes.connection(info, self.connection_rates(info))
                                         for info in self.snapshots(request)])
        conn = self._connection_named(request, rest[0])
        if request.method == "GET":
            info = conn.snapshot()
            return Response.json(shapes.connection(info, self.connection_rates(info)))
        conn.close_forced(request.headers.get("x-reason", "Closed via management plugin"))
        return Response(204)  # DELETE

    def _connection_named(self, request: Request, name: str):
        conn = next((c for c in self.connections() if c.name == name), None)
        if conn is None:
            raise not_found()
        # one's own connection, or any to read for monitors and to close for administrators
        if conn.user != request.user.name and not (
                is_admin(request.user) if request.method == "DELETE" else is_monitor(request.user)):
            raise not_authorised("User not authorised to access object")
        return conn

    async def api_connection_channels(self, request: Request, rest: list[str]) -> Response:
        info = self._connection_named(request, rest[0]).snapshot()
        return self.listed(request, [shapes.channel(info, ch) for ch in info.channels])

    def snapshots(self, request: Request) -> list:
        """Typed snapshots of the connections the user may see."""
        return [c.snapshot() for c in self.visible_connections(request)]

    async def api_channels(self, request: Request, rest: list[str]) -> Response:
        channels = [shapes.channel(c, ch) for c in self.snapshots(request) for ch in c.channels]
        if not rest:
            return self.listed(request, channels)
        found = [ch for ch in channels if ch["name"] == rest[0]]
        if not found:
            raise not_found()
        return Response.json(found[0])

    async def api_consumers(self, request: Request, rest: list[str]) -> Response:
        vhost = rest[0] if rest else None
        return self.listed(request, [
            shapes.consumer(c, ch, consumer) for c in self.snapshots(request)
            if vhost is None or c.vhost == vhost
            for ch in c.channels for consumer in ch.consumers])

    # -- policies and definitions -------------------------------------------------------------

    async def api_policies(self, request: Request, rest: list[str]) -> Response:
        gateway = self.gateway
        if len(rest) <= 1:
            return self.listed(request, [
                shapes.policy(p) for vhost in self._vhosts_in(request, rest)
                for _, p in sorted(gateway.policies.get(vhost.name, {}).items())])
        vhost, name = rest[0], rest[1]
        # a single policy, even to read: administrators, or policymakers in their vhosts
        if not is_admin(request.user) and not (
                is_policymaker(request.user) and (vhost not in gateway.vhosts or
                                                  gateway.access.may_use_vhost(request.user.name,
                                                                              vhost))):
            raise not_authorised("User not authorised to access object")
        if request.method == "GET":
            policy = gateway.policies.get(vhost, {}).get(name)
            if policy is None:
                raise not_found()
            return Response.json(shapes.policy(policy))
        if request.method == "PUT":
            check_name("policy", name)
            body = request.json({"pattern": str, "apply-to": str, "priority": int,
                                 "definition": dict})
            if not is_admin(request.user):
                # RabbitMQ lets a policymaker send the messages of the queues and exchanges
                # it matches to any exchange; here it must be allowed to publish there
                for target in policies.exchanges_named(body.get("definition", {})):
                    try:
                        gateway.access.check(request.user.name, vhost, "write", EXCHANGE,
                                             target)
                    except AMQPError as error:
                        raise not_authorised(error.detail) from None
            try:
                gateway.put_policy(PolicyDef(vhost, name, body.get("pattern", ""),
                                            body.get("apply-to", "all"),
                                            body.get("priority", 0), body.get("definition", {})))
            except ValueError as error:
                raise bad_request(str(error)) from None
            return Response(201)
        if request.method == "DELETE":
            if not gateway.delete_policy(vhost, name):
                raise not_found()
            return Response(204)

    async def api_definitions(self, request: Request, rest: list[str]) -> Response:
        """The whole broker's, or one vhost's (/api/definitions/{vhost})."""
        self.require_admin(request)
        vhost = rest[0] if rest else None
        if vhost is not None and vhost not in self.gateway.vhosts:  # RabbitMQ's answers
            raise (HTTPError(400, "bad_request", "vhost_not_found") if request.method == "GET"
                   else HTTPError(404, "not_found", "vhost_not_found"))
        if request.method == "GET":
            return Response.json(definitions.export(self.gateway) if vhost is None else
                                 definitions.export_vhost(self.gateway, vhost))
        if request.method == "POST":
            # skip-unsupported=true: import what Warren supports, list what it skipped
            skip = request.query.get("skip-unsupported") == "true"
            data = request.json() if vhost is None else definitions.into_vhost(request.json(),
                                                                                vhost)
            try:
                skipped = await definitions.import_(self.gateway, data, skip)
            except definitions.Invalid as error:
                reason = ("invalid definitions, nothing imported" if error.problems else
                          "the definitions hold what Warren does not support, nothing "
                          "imported (skip-unsupported=true imports the rest)")
                return Response.json({"error": "bad_request", "reason": reason,
                                      "problems": error.problems + error.unsupported,
                                      "unsupported": error.unsupported}, 400)
            return Response.json({"skipped": skipped}) if skipped else Response(204)

    async def api_vhost_limits(self, request: Request, rest: list[str]) -> Response:
        return await limits.vhost_limits(self, request, rest)

    async def api_user_limits(self, request: Request, rest: list[str]) -> Response:
        return await limits.user_limits(self, request, rest)

    async def api_parameters(self, request: Request, rest: list[str]) -> Response:
        """RabbitMQ's runtime parameters: here only vhost limits are, as there."""
        return self.listed(request, limits.as_parameters(self, request))

    async def api_operator_policies(self, request: Request, rest: list[str]) -> Response:
        """None: Warren has no operator policies (an import refuses them)."""
        self.require_admin(request)
        return self.listed(request, [])

    async def api_topic_permissions(self, request: Request, rest: list[str]) -> Response:
        """None: Warren has no topic permissions (an import refuses them)."""
        self.require_admin(request)
        return self.listed(request, [])

    async def api_healthchecks(self, request: Request, rest: list[str]) -> Response:
        return self._health()

    async def api_health(self, request: Request, rest: list[str]) -> Response:
        """RabbitMQ's /api/health/checks/..., its bodies, 200 or 503. alarms and
        local-alarms (one node: the same) here also fail while a shard keeps dying."""
        check, args = rest[1], rest[2:]
        if check in ("alarms", "local-alarms"):
            return self._health()
        if check == "virtual-hosts":  # a vhost is never down on its own here
            return Response.json({"status": "ok"})
        if check in ("node-is-quorum-critical", "node-is-mirror-sync-critical"):
            return Response.json({"status": "ok", "reason": "single node cluster"})
        if check == "port-listener":
            return health.port_listener(self.listeners, args[0])
        if check == "protocol-listener":
            return health.protocol_listener(self.listeners, args[0])
        return health.certificate_expiration(self.listeners, self.gateway.config.tls_certfile,
                                             *args, time.time())

    def _health(self) -> Response:
        gateway = self.gateway
        alarms = [{"node": NODE, "resource": resource}
                  for resource in sorted({resource for _, resource in gateway.alarms.active})]
        shards = _failing_shards(gateway)
        if not alarms and not shards:
            return Response.json({"status": "ok"})
        reasons = (["resource alarm(s) in effect in the cluster"] if alarms else []) + [
            f"shard {s['shard']} keeps failing ({s['restarts']} restarts, last exit code "
            f"{s['exit_code']})" for s in shards]
        return Response.json({"status": "failed", "reason": "; ".join(reasons),
                              "alarms": alarms, "failing_shards": shards}, status=503)

    async def api_aliveness_test(self, request: Request, rest: list[str]) -> Response:
        if rest:  # RabbitMQ's test declares a queue there: it needs the permission
            self.check_permission(request, self._vhost_named(request, rest[0]), "configure",
                                  QUEUE, "aliveness-test")
        return Response.json({"status": "ok"})


COUNTED = ("published", "delivered", "redelivered", "acked")  # per queue, with rates
# the overview's message_stats for monitors, from the broker's totals
GLOBAL_STATS = (("publish", "received"), ("confirm", "confirmed"), ("deliver_get", "delivered"),
                ("deliver", "consume_manual_ack"), ("deliver_no_ack", "consume_auto_ack"),
                ("get", "get_manual_ack"), ("get_no_ack", "get_auto_ack"),
                ("get_empty", "get_empty"), ("redeliver", "redelivered"),
                ("ack", "acknowledged"), ("drop_unroutable", "unroutable_dropped"),
                ("return_unroutable", "unroutable_returned"))


async def _answer(ask):
    """What `ask(answered)` passes to `answered`, now or later (from the root)."""
    answer = asyncio.get_running_loop().create_future()
    ask(lambda value: answer.done() or answer.set_result(value))
    return await answer


def _traffic(info) -> dict[str, int]:
    """A connection's byte counters that rates are shown for."""
    return {"recv_oct": info.recv_oct, "send_oct": info.send_oct}


def _failing_shards(gateway) -> list[dict]:
    return [{"shard": index, **failure}
            for index, failure in sorted(gateway.shards.failing.items())]
