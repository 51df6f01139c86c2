"""Who may use the broker: /api/vhosts, /api/users, /api/permissions and their
topic-permissions (none here: an import refuses them)."""

from __future__ import annotations

from ..broker import patterns
from . import shapes
from .http import Request, Response, bad_request, check_name, not_found
from .listing import listed
from .rights import is_monitor, require_admin


async def vhosts(management, request: Request, rest: list[str]) -> Response:
    gateway = management.gateway
    if not rest:
        names = sorted(gateway.catalogue.vhosts) if is_monitor(request.user) \
            else management.permitted_vhosts(request)
        return listed(request, [_vhost(gateway, name) for name in names])
    require_admin(request)
    name = rest[0]
    if request.method == "GET":
        if name not in gateway.catalogue.vhosts:
            raise not_found()
        return Response.json(_vhost(gateway, name))
    if request.method == "PUT":
        check_name("vhost", name)
        body = request.json({"description": str})
        created = name not in gateway.catalogue.vhosts
        gateway.catalogue.add_vhost(name, body.get("description", ""),
                          (gateway.catalogue.vhost_defs.get(name).limits if not created else {}))
        if created:  # as RabbitMQ's: its creator may use it at once
            gateway.access.grant_creator(request.user.name, name)
        return Response(201 if created else 204)
    if not gateway.catalogue.delete_vhost(name):  # DELETE
        raise not_found()
    return Response(204)


def _vhost(gateway, name: str) -> dict:
    definition = gateway.catalogue.vhost_defs.get(name)
    return {"name": name, "description": definition.description if definition else "",
            "tags": [], "default_queue_type": "classic", "tracing": False,
            "limits": definition.limits if definition else {},
            "metadata": {"description": definition.description if definition else "",
                         "tags": []}}


async def vhost_permissions(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)
    if rest[0] not in management.gateway.catalogue.vhosts:
        raise not_found()
    return listed(request, [shapes.permission(p) for (_, vhost), p in
                            sorted(management.gateway.access.permissions.items())
                            if vhost == rest[0]])


async def vhost_topic_permissions(management, request: Request, rest: list[str]) -> Response:
    """None: Warren has no topic permissions (an import refuses them)."""
    require_admin(request)
    if rest[0] not in management.gateway.catalogue.vhosts:
        raise not_found()
    return listed(request, [])


async def users(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)  # password hashes are for administrators' eyes
    access = management.gateway.access
    if not rest:
        return listed(request, [shapes.user(u) for _, u in sorted(access.users.items())])
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
    for conn in [c for c in management.connections() if c.user == name]:
        conn.close_forced(f"user '{name}' is deleted")
    return Response(204)


async def user_permissions(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)
    access = management.gateway.access
    if rest[0] not in access.users:
        raise not_found()
    return listed(request, [shapes.permission(p) for (user, _), p in
                            sorted(access.permissions.items()) if user == rest[0]])


async def user_topic_permissions(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)
    if rest[0] not in management.gateway.access.users:
        raise not_found()
    return listed(request, [])


async def permissions(management, request: Request, rest: list[str]) -> Response:
    require_admin(request)
    access = management.gateway.access
    if not rest:
        return listed(request, [shapes.permission(p)
                                for _, p in sorted(access.permissions.items())])
    vhost, user = rest
    if request.method == "GET":
        permission = access.permissions.get((user, vhost))
        if permission is None:
            raise not_found()
        return Response.json(shapes.permission(permission))
    if request.method == "PUT":
        if vhost not in management.gateway.catalogue.vhosts or user not in access.users:
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


async def topic_permissions(management, request: Request, rest: list[str]) -> Response:
    """None: Warren has no topic permissions (an import refuses them)."""
    require_admin(request)
    return listed(request, [])
