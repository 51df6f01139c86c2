"""The management HTTP API: RabbitMQ's management-plugin JSON for what Warren
has, on the gateway's event loop. Queue figures come from the shards
(QueueInfo); rates are the change between two samples."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from importlib import resources

from warren.shards import records as r
from warren.storage.metastore import PolicyDef

from .. import __version__, arguments
from ..errors import AMQPError, refusal_error
from ..exchange import EXCHANGE, EXCHANGE_TYPES, QUEUE, Exchange
from . import definitions, limits, metrics
from .http import HTTPError, Request, Response, bad_request

COMPATIBLE_RABBITMQ = "3.13.7"  # the management API version Warren's JSON follows
NODE = f"warren@{socket.gethostname()}"
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


def flag(body: dict, name: str, default: bool) -> bool:
    """A boolean field: true or false, or "true" or "false" as rabbitmqadmin sends."""
    value = body.get(name, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise bad_request(f"{name} must be a boolean")


class Management:
    def __init__(self, gateway, listeners: list[dict] | None = None):
        self.gateway = gateway
        self.started = time.time()
        self.listeners = listeners or []
        self._previous: dict[int, tuple[float, list[int]]] = {}  # qid -> (time, figures)
        self._rates: dict[int, dict[str, float]] = {}
        self.shard_fsyncs: dict[int, tuple[int, int]] = {}  # shard -> (fsyncs, messages)

    # -- figures from the shards -----------------------------------------------------

    async def queue_figures(self) -> dict[int, dict]:
        """Per qid: ready, unacked, consumers, bytes, counters, and their rates."""
        loop = asyncio.get_running_loop()
        futures = []
        for link in self.gateway.shards:
            future = loop.create_future()
            futures.append((link.index, future))
            link.request(lambda req: r.QueueInfo(req, []),
                         lambda reply, f=future: f.done() or f.set_result(reply))
        figures: dict[int, dict] = {}
        now = time.monotonic()
        for index, future in futures:
            try:
                reply = await asyncio.wait_for(future, 2.0)
            except asyncio.TimeoutError:
                continue
            if type(reply) is not r.QueueInfoReply:
                continue  # the shard is down
            self.shard_fsyncs[index] = (reply.fsyncs, reply.messages)
            for entry in reply.queues:
                values = dict(zip(r.QUEUE_INFO_FIELDS, entry))
                qid = values["qid"]
                previous = self._previous.get(qid)
                if previous is not None and now - previous[0] >= 0.5:
                    elapsed = now - previous[0]
                    self._rates[qid] = {name: max(0.0, (values[name] - old) / elapsed)
                                        for name, old in previous[1].items()}
                if previous is None or now - previous[0] >= 0.5:
                    self._previous[qid] = (now, {name: values[name] for name in _COUNTED})
                values["rates"] = self._rates.get(qid, dict.fromkeys(_COUNTED, 0.0))
                figures[qid] = values
        return figures

    # -- authentication ----------------------------------------------------------------

    async def authenticate(self, request: Request) -> None:
        credentials = request.credentials()
        # Browsers answer a challenge with a password dialog: the dashboard signs in
        # with its own form, so its requests (X-Requested-With) get none.
        challenge = ({} if "x-requested-with" in request.headers
                     else {"WWW-Authenticate": 'Basic realm="Warren management"'})
        if credentials is None:
            raise HTTPError(401, "not_authorised", "Not_Authorized", challenge)
        user, delay = self.gateway.access.login(*credentials, request.peer)
        if user is None:
            if delay:  # throttled: answer later; the loop serves everyone else meanwhile
                loop = asyncio.get_running_loop()
                answer = loop.create_future()
                loop.call_later(delay, lambda: answer.done() or answer.set_result(None))
                await answer
            raise HTTPError(401, "not_authorised", "Login failed", challenge)
        if MANAGEMENT_TAGS.isdisjoint(user.tags):
            raise not_authorised("Not management user")
        request.user = user

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

    def visible_connections(self, request: Request) -> list:
        """Monitors see every client connection, the others their own."""
        if is_monitor(request.user):
            return self._connections()
        return [c for c in self._connections() if c.user == request.user.name]

    # -- dispatch ------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        parts = request.parts
        if not parts:
            return Response(200, _dashboard(), "text/html; charset=utf-8")
        if parts == ["metrics"]:
            return Response(200, (await metrics.render(self)).encode(),
                            "text/plain; version=0.0.4; charset=utf-8")
        if parts[0] != "api":
            raise not_found()
        await self.authenticate(request)
        name = parts[1] if len(parts) > 1 else ""
        handler = getattr(self, f"api_{name.replace('-', '_')}", None)
        if handler is None:
            raise not_found()
        return await handler(request, parts[2:])

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
        connections = self.visible_connections(request)
        ready = sum(f["ready"] for f in figures)
        unacked = sum(f["unacked"] for f in figures)
        overview = {
            "management_version": COMPATIBLE_RABBITMQ,
            "rabbitmq_version": COMPATIBLE_RABBITMQ,
            "product_name": "Warren", "product_version": __version__,
            "erlang_version": "none (Python)", "cluster_name": NODE,
            "object_totals": {
                "connections": len(connections),
                "channels": sum(len(c.channels) for c in connections),
                "exchanges": sum(len(v.exchanges) for v in vhosts),
                "queues": len(queues),
            },
            "queue_totals": {"messages": ready + unacked, "messages_ready": ready,
                             "messages_unacknowledged": unacked},
            "message_stats": _message_stats(figures),
        }
        if monitor:
            overview["node"] = NODE
            overview["listeners"] = self.listeners
            overview["object_totals"]["consumers"] = sum(
                len(ch.consumers) for c in connections for ch in c.channels.values())
        return Response.json(overview)

    async def api_nodes(self, request: Request, rest: list[str]) -> Response:
        self.require_monitor(request)
        node = self._node()
        if rest:
            if rest[0] != NODE:
                raise not_found()
            return Response.json(node)
        return Response.json([node])

    def _node(self) -> dict:
        gateway = self.gateway
        pids = [os.getpid(), *self.shard_pids().values()]
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

    def shard_pids(self) -> dict[int, int]:
        return {link.index: link.process.pid for link in self.gateway.shards
                if link.process is not None and link.process.poll() is None}

    # -- vhosts, users, permissions ---------------------------------------------------------

    async def api_vhosts(self, request: Request, rest: list[str]) -> Response:
        gateway = self.gateway
        if not rest:
            names = sorted(gateway.vhosts) if is_monitor(request.user) \
                else self.permitted_vhosts(request)
            return Response.json([self._vhost(name) for name in names])
        self.require_admin(request)
        name = rest[0]
        if request.method == "GET":
            if name not in gateway.vhosts:
                raise not_found()
            return Response.json(self._vhost(name))
        if request.method == "PUT":
            body = request.json({"description": str})
            created = name not in gateway.vhosts
            gateway.add_vhost(name, body.get("description", ""),
                             (gateway.vhost_defs.get(name).limits if not created else {}))
            return Response(201 if created else 204)
        if request.method == "DELETE":
            if not gateway.delete_vhost(name):
                raise not_found()
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

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
            return Response.json([_user(u) for _, u in sorted(access.users.items())])
        name = rest[0]
        if request.method == "GET":
            user = access.users.get(name)
            if user is None:
                raise not_found()
            return Response.json(_user(user))
        if request.method == "PUT":
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
        if request.method == "DELETE":
            if not access.delete_user(name):
                raise not_found()
            for conn in [c for c in self._connections() if c.user == name]:
                conn.close_forced(f"user '{name}' is deleted")
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    async def api_whoami(self, request: Request, rest: list[str]) -> Response:
        return Response.json({"name": request.user.name, "tags": request.user.tags})

    async def api_permissions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        access = self.gateway.access
        if not rest:
            return Response.json([_permission(p) for _, p in sorted(access.permissions.items())])
        if len(rest) != 2:
            raise not_found()
        vhost, user = rest
        if request.method == "GET":
            permission = access.permissions.get((user, vhost))
            if permission is None:
                raise not_found()
            return Response.json(_permission(permission))
        if request.method == "PUT":
            if vhost not in self.gateway.vhosts or user not in access.users:
                raise not_found()
            body = request.json({"configure": str, "write": str, "read": str})
            values = [body.get(k, "") for k in ("configure", "write", "read")]
            access.set_permissions(user, vhost, *values)
            return Response(201)
        if request.method == "DELETE":
            if not access.clear_permissions(user, vhost):
                raise not_found()
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    # -- queues -----------------------------------------------------------------------------

    async def api_queues(self, request: Request, rest: list[str]) -> Response:
        vhosts = self._vhosts_in(request, rest)
        if len(rest) <= 1:
            figures = await self.queue_figures()
            return Response.json([self._queue(meta, figures.get(meta.qid))
                                  for vhost in vhosts for _, meta in sorted(vhost.queues.items())])
        vhost = vhosts[0]
        name = rest[1]
        meta = vhost.queues.get(name)
        if len(rest) == 3 and rest[2] == "contents" and request.method == "DELETE":
            if meta is None:
                raise not_found()
            self.check_permission(request, vhost, "read", QUEUE, name)
            await self._shard_request(meta, lambda req: r.PurgeQueue(req, meta.qid))
            return Response(204)
        if len(rest) != 2:
            raise not_found()
        if request.method == "GET":
            if meta is None:
                raise not_found()
            figures = await self.queue_figures()
            return Response.json(self._queue(meta, figures.get(meta.qid)))
        if request.method == "PUT":
            self.check_permission(request, vhost, "configure", QUEUE, name)
            body = request.json({"arguments": dict})
            args = body.get("arguments", {})
            durable = flag(body, "durable", True)
            auto_delete = flag(body, "auto_delete", False)
            if meta is not None:
                return Response(204)
            what = f"queue '{name}' in vhost '{vhost.name}'"
            try:
                arguments.check_queue_type(args, durable, False, auto_delete, what)
                arguments.validate(args, arguments.QUEUE_ARGUMENTS, what)
            except AMQPError as error:
                raise bad_request(error.text) from None
            self.gateway.create_queue(vhost, name, durable, None, auto_delete, args)
            return Response(201)
        if request.method == "DELETE":
            if meta is None:
                raise not_found()
            self.check_permission(request, vhost, "configure", QUEUE, name)
            await self._shard_request(meta, lambda req: r.DeleteQueue(
                req, meta.qid, request.query.get("if-unused") == "true",
                request.query.get("if-empty") == "true"))
            self.gateway.forget_queue(meta)
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    async def _shard_request(self, meta, make) -> r.Reply:
        future = asyncio.get_running_loop().create_future()
        self.gateway.shards[meta.shard].request(make, lambda reply: future.done()
                                              or future.set_result(reply))
        reply = await asyncio.wait_for(future, 10.0)
        if reply.refused:
            raise bad_request(refusal_error(reply.refused, meta.vhost, meta.name).text)
        return reply

    def _queue(self, meta, figure: dict | None) -> dict:
        figure = figure or {}
        ready, unacked = figure.get("ready", 0), figure.get("unacked", 0)
        policy = meta.policy
        return {
            "name": meta.name, "vhost": meta.vhost, "durable": meta.durable,
            "auto_delete": meta.auto_delete, "exclusive": meta.owner is not None,
            "arguments": meta.arguments, "type": meta.queue_type, "node": NODE,
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
            "message_stats": _message_stats([figure]) if figure else {},
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
            return Response.json([_exchange(x) for vhost in vhosts
                                  for _, x in sorted(vhost.exchanges.items())])
        vhost = vhosts[0]
        name = rest[1]
        exchange = vhost.exchanges.get(name)
        if request.method == "GET":
            if exchange is None:
                raise not_found()
            return Response.json(_exchange(exchange))
        if request.method == "PUT":
            self.check_permission(request, vhost, "configure", EXCHANGE, name)
            body = request.json({"type": str, "arguments": dict})
            kind = body.get("type", "direct")
            if kind not in EXCHANGE_TYPES:
                raise bad_request(f"unknown exchange type '{kind}'")
            durable, auto_delete, internal = (flag(body, "durable", True),
                                              flag(body, "auto_delete", False),
                                              flag(body, "internal", False))
            args = body.get("arguments", {})
            try:
                arguments.validate(args, arguments.EXCHANGE_ARGUMENTS,
                                   f"exchange '{name}' in vhost '{vhost.name}'")
            except AMQPError as error:
                raise bad_request(error.text) from None
            if exchange is not None:
                return Response(204)
            if name.startswith("amq.") or name == "":
                raise HTTPError(403, "access_refused", f"exchange name '{name}' is reserved")
            gateway.add_exchange(Exchange(vhost.name, name, kind, durable, auto_delete, internal,
                                         args))
            return Response(201)
        if request.method == "DELETE":
            if exchange is None:
                raise not_found()
            if name == "" or name.startswith("amq."):
                raise HTTPError(403, "access_refused", f"cannot delete exchange '{name}'")
            self.check_permission(request, vhost, "configure", EXCHANGE, name)
            gateway.delete_exchange(exchange)
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    async def api_bindings(self, request: Request, rest: list[str]) -> Response:
        vhosts = self._vhosts_in(request, rest)
        if len(rest) <= 1:
            return Response.json([b for vhost in vhosts for b in bindings_of(vhost)])
        # POST /api/bindings/{vhost}/e/{source}/q|e/{destination}
        if len(rest) == 5 and request.method == "POST" and rest[1] == "e" and rest[3] in "qe":
            vhost = vhosts[0]
            source = vhost.exchanges.get(rest[2])
            kind = QUEUE if rest[3] == "q" else EXCHANGE
            target = (vhost.queues if kind == QUEUE else vhost.exchanges).get(rest[4])
            if source is None or target is None or source.name == "":
                raise not_found()
            self.check_permission(request, vhost, "write", kind, rest[4])
            self.check_permission(request, vhost, "read", EXCHANGE, rest[2])
            body = request.json({"routing_key": str, "arguments": dict})
            self.gateway.bind(source, (kind, rest[4]), body.get("routing_key", ""),
                             body.get("arguments", {}))
            return Response(201)
        # DELETE /api/bindings/{vhost}/e/{source}/q|e/{destination}/{properties_key}
        if len(rest) == 6 and request.method == "DELETE" and rest[1] == "e" and rest[3] in "qe":
            vhost = vhosts[0]
            source = vhost.exchanges.get(rest[2])
            kind = QUEUE if rest[3] == "q" else EXCHANGE
            found = [(key, args) for (destination, key, _), args in
                     (source.bindings.items() if source is not None else ())
                     if destination == (kind, rest[4]) and properties_key(key, args) == rest[5]]
            if not found:
                raise not_found()
            self.check_permission(request, vhost, "write", kind, rest[4])
            self.check_permission(request, vhost, "read", EXCHANGE, rest[2])
            self.gateway.unbind(source, (kind, rest[4]), *found[0])
            return Response(204)
        raise not_found()

    # -- connections, channels, consumers -------------------------------------------------------

    def _connections(self) -> list:
        return [c for c in self.gateway.connections if c.vhost is not None]

    async def api_connections(self, request: Request, rest: list[str]) -> Response:
        if not rest:
            return Response.json([_connection(c) for c in self.visible_connections(request)])
        conn = next((c for c in self._connections() if c.name == rest[0]), None)
        if conn is None:
            raise not_found()
        # one's own connection, or any to read for monitors and to close for administrators
        if conn.user != request.user.name and not (
                is_admin(request.user) if request.method == "DELETE" else is_monitor(request.user)):
            raise not_authorised("User not authorised to access object")
        if request.method == "GET":
            return Response.json(_connection(conn))
        if request.method == "DELETE":
            conn.close_forced(request.headers.get("x-reason", "Closed via management plugin"))
            return Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    async def api_channels(self, request: Request, rest: list[str]) -> Response:
        return Response.json([_channel(c, ch) for c in self.visible_connections(request)
                              for _, ch in sorted(c.channels.items())])

    async def api_consumers(self, request: Request, rest: list[str]) -> Response:
        vhost = rest[0] if rest else None
        return Response.json([
            _consumer(c, ch, consumer) for c in self.visible_connections(request)
            if vhost is None or c.vhost.name == vhost
            for _, ch in sorted(c.channels.items())
            for consumer in [*ch.consumers.values(), *(t[0] for t in ch.timed_out.values())]])

    # -- policies and definitions -------------------------------------------------------------

    async def api_policies(self, request: Request, rest: list[str]) -> Response:
        gateway = self.gateway
        if len(rest) <= 1:
            return Response.json([_policy(p) for vhost in self._vhosts_in(request, rest)
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
            return Response.json(_policy(policy))
        if request.method == "PUT":
            body = request.json({"pattern": str, "apply-to": str, "priority": int,
                                 "definition": dict})
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
        raise HTTPError(405, "method_not_allowed", request.method)

    async def api_definitions(self, request: Request, rest: list[str]) -> Response:
        self.require_admin(request)
        if request.method == "GET":
            return Response.json(definitions.export(self.gateway))
        if request.method == "POST":
            # skip-unsupported=true: import what Warren supports, list what it skipped
            skip = request.query.get("skip-unsupported") == "true"
            try:
                skipped = definitions.import_(self.gateway, request.json(), skip)
            except definitions.Invalid as error:
                reason = ("invalid definitions, nothing imported" if error.problems else
                          "the definitions hold what Warren does not support, nothing "
                          "imported (skip-unsupported=true imports the rest)")
                return Response.json({"error": "bad_request", "reason": reason,
                                      "problems": error.problems + error.unsupported,
                                      "unsupported": error.unsupported}, 400)
            return Response.json({"skipped": skipped}) if skipped else Response(204)
        raise HTTPError(405, "method_not_allowed", request.method)

    async def api_vhost_limits(self, request: Request, rest: list[str]) -> Response:
        return await limits.vhost_limits(self, request, rest)

    async def api_user_limits(self, request: Request, rest: list[str]) -> Response:
        return await limits.user_limits(self, request, rest)

    async def api_healthchecks(self, request: Request, rest: list[str]) -> Response:
        return self._health()

    async def api_health(self, request: Request, rest: list[str]) -> Response:
        """RabbitMQ's /api/health/checks/alarms and local-alarms (one node: the same),
        which here also fail while a shard keeps dying."""
        if len(rest) != 2 or rest[0] != "checks" or rest[1] not in ("alarms", "local-alarms"):
            raise not_found()
        return self._health()

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


_COUNTED = ("published", "delivered", "redelivered", "acked")


def _failing_shards(gateway) -> list[dict]:
    return [{"shard": index, **failure}
            for index, failure in sorted(gateway.shards.failing.items())]


def _message_stats(figures) -> dict:
    stats = {}
    for name, key in (("publish", "published"), ("deliver_get", "delivered"), ("ack", "acked"),
                      ("redeliver", "redelivered")):
        stats[name] = sum(f.get(key, 0) for f in figures)
        stats[f"{name}_details"] = {"rate": round(sum(f.get("rates", {}).get(key, 0.0)
                                                      for f in figures), 1)}
    return stats


def _user(user) -> dict:
    return {"name": user.name, "password_hash": user.password_hash,
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": user.tags,
            "limits": user.limits}


def _permission(p) -> dict:
    return {"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
            "read": p.read}


def _policy(p) -> dict:
    return {"vhost": p.vhost, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
            "definition": p.definition, "priority": p.priority}


def _exchange(x) -> dict:
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
    for _, exchange in sorted(vhost.exchanges.items()):
        for (destination, routing_key, _), args in exchange.bindings.items():
            found.append({"source": exchange.name, "vhost": vhost.name,
                          "destination": destination[1], "destination_type": destination[0],
                          "routing_key": routing_key, "arguments": args,
                          "properties_key": properties_key(routing_key, args)})
    return found


def _connection(conn) -> dict:
    peer = conn.peer if isinstance(conn.peer, tuple) else ("?", 0)
    local = conn.transport.get_extra_info("sockname") or ("?", 0)
    return {"name": conn.name, "user": conn.user, "vhost": conn.vhost.name,
            "peer_host": peer[0], "peer_port": peer[1], "host": local[0], "port": local[1],
            "channels": len(conn.channels), "state": conn.flow_state, "protocol": "AMQP 0-9-1",
            "type": "network", "node": NODE, "auth_mechanism": "PLAIN",
            "client_properties": _jsonable(conn.client_properties),
            "connected_at": int(conn.connected_at * 1000),
            "frame_max": conn.frame_max, "timeout": conn.heartbeat,
            "channel_max": conn.channel_max,
            "ssl": conn.transport.get_extra_info("sslcontext") is not None}


def _channel_details(conn, ch) -> dict:
    peer = conn.peer if isinstance(conn.peer, tuple) else ("?", 0)
    name = conn.name
    return {"name": f"{name} ({ch.number})", "number": ch.number, "connection_name": name,
            "peer_host": peer[0], "peer_port": peer[1], "user": conn.user}


def _channel(conn, ch) -> dict:
    details = _channel_details(conn, ch)
    return {"name": details["name"], "number": ch.number,
            "connection_details": {"name": details["connection_name"],
                                   "peer_host": details["peer_host"],
                                   "peer_port": details["peer_port"]},
            "user": conn.user, "vhost": conn.vhost.name, "node": NODE,
            "consumer_count": len(ch.consumers) + (1 if ch.reply_consumer else 0),
            "messages_unacknowledged": len(ch.unacked),
            "prefetch_count": ch.consumer_prefetch,
            "global_prefetch_count": ch.channel_prefetch,
            "confirm": ch.confirms is not None, "transactional": ch.tx is not None,
            "state": "closing" if ch.closing else "running"}


def _consumer(conn, ch, consumer) -> dict:
    timed_out = getattr(consumer, "timed_out", False)
    return {"consumer_tag": consumer.tag,
            "queue": {"name": consumer.meta.name, "vhost": consumer.meta.vhost},
            "channel_details": _channel_details(conn, ch),
            "ack_required": not consumer.no_ack, "prefetch_count": consumer.prefetch,
            "exclusive": consumer.exclusive,
            "active": not timed_out, "activity_status": "timed_out" if timed_out else "up",
            "status": "timed_out" if timed_out else "active",
            "consumer_timeout": getattr(consumer, "timeout_ms", 0) or None,
            "arguments": _jsonable(getattr(consumer, "arguments", {}))}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _dashboard() -> bytes:
    return resources.files("warren.gateway.management").joinpath("dashboard.html").read_bytes()
