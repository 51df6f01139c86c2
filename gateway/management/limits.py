"""Vhost and user limits, as RabbitMQ has them: which exist, what values they
take, and RabbitMQ's /api/vhost-limits and /api/user-limits over them."""

from __future__ import annotations

from .http import HTTPError, Request, Response, bad_request, not_found
from .rights import require_admin

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


def problem(limits, known: tuple[str, ...]) -> str | None:
    """Why a set of limits cannot be set, or None. A negative value is no limit."""
    if not isinstance(limits, dict):
        return "expected an object of limits"
    unknown = [name for name in limits if name not in known]
    if unknown:
        return (f"unrecognised limit(s) {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(known)})")
    for name, value in limits.items():
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} should be an integer, got {value!r}"
    return None


def _changed(request: Request, limits: dict, name: str, known: tuple[str, ...]) -> dict:
    """The limits after a PUT {"value": n} or a DELETE of the one named."""
    limits = dict(limits)
    if request.method == "PUT":
        value = request.json().get("value")
        reason = problem({name: value}, known)
        if reason:
            raise bad_request(reason)
        limits[name] = value
    else:  # DELETE
        limits.pop(name, None)
    return limits


async def vhost_limits(management, request: Request, rest: list[str]) -> Response:
    """GET /api/vhost-limits[/{vhost}], PUT and DELETE /api/vhost-limits/{vhost}/{name}."""
    gateway = management.gateway
    if len(rest) <= 1:
        names = [management.vhost_named(request, rest[0]).name] if rest \
            else management.permitted_vhosts(request)
        return Response.json([{"vhost": name, "value": gateway.catalogue.vhost_defs[name].limits}
                              for name in names if gateway.catalogue.vhost_defs[name].limits])
    if len(rest) != 2:
        raise not_found()
    require_admin(request)
    definition = gateway.catalogue.vhost_defs.get(rest[0])
    if definition is None:
        raise HTTPError(404, "not_found", "vhost_not_found")
    gateway.catalogue.add_vhost(rest[0], definition.description,
                      _changed(request, definition.limits, rest[1], VHOST_LIMITS))
    return Response(204)


def as_parameters(management, request: Request) -> list[dict]:
    """The vhosts' limits as RabbitMQ lists them among its runtime parameters
    (GET /api/parameters), for the vhosts the user sees."""
    defs = management.gateway.catalogue.vhost_defs
    return [{"value": defs[name].limits, "vhost": name, "component": "vhost-limits",
             "name": "limits"} for name in management.permitted_vhosts(request)
            if defs[name].limits]


async def user_limits(management, request: Request, rest: list[str]) -> Response:
    """GET /api/user-limits[/{user}], PUT and DELETE /api/user-limits/{user}/{name}."""
    require_admin(request)
    access = management.gateway.access
    if len(rest) <= 1:
        if rest and rest[0] not in access.users:
            raise not_found()
        users = [access.users[rest[0]]] if rest else [u for _, u in sorted(access.users.items())]
        return Response.json([{"user": u.name, "value": u.limits} for u in users if u.limits])
    if len(rest) != 2:
        raise not_found()
    user = access.users.get(rest[0])
    if user is None:
        raise HTTPError(404, "not_found", "user_not_found")
    access.put_user(user.name, None, user.tags, None,
                    _changed(request, user.limits, rest[1], USER_LIMITS))
    return Response(204)
