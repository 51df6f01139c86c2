"""The management API's routes, RabbitMQ's paths that Warren serves: a path is
served only when one of them matches it whole, so an unknown sub-path never
reaches its parent's handler (DELETE /api/users/U/permissions deleted the user)."""

from __future__ import annotations

from typing import NamedTuple

GET, PUT, POST, DELETE = "GET", "PUT", "POST", "DELETE"


class Route(NamedTuple):
    pattern: tuple[str, ...]  # after /api/: literal segments, "*" for a name
    methods: tuple[str, ...]
    handler: str  # its name in api.HANDLERS


def _routes(table: str) -> tuple[Route, ...]:
    routes = []
    for line in table.strip().splitlines():
        path, methods, handler = line.split()
        routes.append(Route(tuple(path.split("/")), tuple(methods.split(",")), handler))
    return tuple(routes)


# path (after /api/, "*" a name), methods, handler
ROUTES = _routes("""
overview                                GET             overview
cluster-name                            GET,PUT         cluster_name
extensions                              GET             extensions
whoami                                  GET             whoami
nodes                                   GET             nodes
nodes/*                                 GET             nodes
vhosts                                  GET             vhosts
vhosts/*                                GET,PUT,DELETE  vhosts
vhosts/*/permissions                    GET             vhost_permissions
vhosts/*/topic-permissions              GET             vhost_topic_permissions
vhosts/*/connections                    GET             vhost_connections
vhosts/*/channels                       GET             vhost_channels
users                                   GET             users
users/*                                 GET,PUT,DELETE  users
users/*/permissions                     GET             user_permissions
users/*/topic-permissions               GET             user_topic_permissions
permissions                             GET             permissions
permissions/*/*                         GET,PUT,DELETE  permissions
queues                                  GET             queues
queues/*                                GET             queues
queues/*/*                              GET,PUT,DELETE  queues
queues/*/*/contents                     DELETE          queues
queues/*/*/get                          POST            queues
queues/*/*/bindings                     GET             queue_bindings
quorum-status/*/*                       GET             quorum_status
quorum-members/*/*/*                    POST,DELETE     quorum_members
quorum-grow/*                           POST            quorum_grow
quorum-shrink/*                         POST            quorum_shrink
exchanges                               GET             exchanges
exchanges/*                             GET             exchanges
exchanges/*/*                           GET,PUT,DELETE  exchanges
exchanges/*/*/publish                   POST            exchanges
exchanges/*/*/bindings/source           GET             exchange_bindings
exchanges/*/*/bindings/destination      GET             exchange_bindings
bindings                                GET             bindings
bindings/*                              GET             bindings
bindings/*/e/*/q/*                      GET,POST        bindings
bindings/*/e/*/e/*                      GET,POST        bindings
bindings/*/e/*/q/*/*                    GET,DELETE      bindings
bindings/*/e/*/e/*/*                    GET,DELETE      bindings
connections                             GET             connections
connections/*                           GET,DELETE      connections
connections/*/channels                  GET             connection_channels
channels                                GET             channels
channels/*                              GET             channels
consumers                               GET             consumers
consumers/*                             GET             consumers
policies                                GET             policies
policies/*                              GET             policies
policies/*/*                            GET,PUT,DELETE  policies
definitions                             GET,POST        definitions
definitions/*                           GET,POST        definitions
vhost-limits                            GET             vhost_limits
vhost-limits/*                          GET             vhost_limits
vhost-limits/*/*                        PUT,DELETE      vhost_limits
user-limits                             GET             user_limits
user-limits/*                           GET             user_limits
user-limits/*/*                         PUT,DELETE      user_limits
parameters                              GET             parameters
operator-policies                       GET             operator_policies
topic-permissions                       GET             topic_permissions
aliveness-test/*                        GET             aliveness_test
healthchecks/node                       GET             healthchecks
health/checks/alarms                    GET             health
health/checks/local-alarms              GET             health
health/checks/virtual-hosts             GET             health
health/checks/node-is-quorum-critical   GET             health
health/checks/node-is-mirror-sync-critical GET          health
health/checks/port-listener/*           GET             health
health/checks/protocol-listener/*       GET             health
health/checks/certificate-expiration/*/* GET            health
""")


class NotServed(Exception):
    """No route matches the path (404), or one does but not with this method
    (405; `allowed` lists the methods it takes)."""

    def __init__(self, allowed: tuple[str, ...] = ()):
        super().__init__(", ".join(allowed) or "not found")
        self.allowed = allowed


def allow_header(methods: tuple[str, ...]) -> str:
    """RabbitMQ's Allow header for a route taking `methods`: HEAD with GET, and
    OPTIONS, which every route answers."""
    offered = set(methods) | {"OPTIONS"} | ({"HEAD"} if GET in methods else set())
    return ", ".join(m for m in ("HEAD", GET, PUT, POST, DELETE, "OPTIONS") if m in offered)


def _fits(pattern: tuple[str, ...], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(
        p == "*" or p == part for p, part in zip(pattern, parts))


def match(parts: list[str], method: str) -> str:
    """The handler of the route `parts` (the path's segments after "api") names
    whole, with `method`; NotServed otherwise."""
    allowed: list[str] = []
    for route in ROUTES:
        if _fits(route.pattern, parts):
            if method in route.methods:
                return route.handler
            allowed += [m for m in route.methods if m not in allowed]
    raise NotServed(tuple(allowed))
