"""RabbitMQ's runtime parameters and policies: /api/policies (administrators, and
policymakers in their vhosts), /api/operator-policies (none here: an import
refuses them) and /api/parameters (here only vhost limits are, as there)."""

from __future__ import annotations

from warren.storage.metastore import PolicyDef

from ..broker.exchange import EXCHANGE
from ..broker.policies import exchanges_named
from ..errors import AMQPError
from . import limits, shapes
from .http import Request, Response, bad_request, check_name, not_authorised, not_found
from .listing import listed
from .rights import is_admin, is_policymaker, require_admin


async def policies(management, request: Request, rest: list[str]) -> Response:
    gateway = management.gateway
    if len(rest) <= 1:
        return listed(request, [
            shapes.policy(p) for vhost in management.vhosts_in(request, rest)
            for _, p in sorted(gateway.catalogue.policies.get(vhost.name, {}).items())])
    vhost, name = rest[0], rest[1]
    # a single policy, even to read: administrators, or policymakers in their vhosts
    if not is_admin(request.user) and not (
            is_policymaker(request.user) and (vhost not in gateway.catalogue.vhosts or
                                              gateway.access.may_use_vhost(request.user.name,
                                                                           vhost))):
        raise not_authorised("User not authorised to access object")
    if request.method == "GET":
        policy = gateway.catalogue.policies.get(vhost, {}).get(name)
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
            for target in exchanges_named(body.get("definition", {})):
                try:
                    gateway.access.check(request.user.name, vhost, "write", EXCHANGE, target)
                except AMQPError as error:
                    raise not_authorised(error.detail) from None
        try:
            gateway.catalogue.put_policy(PolicyDef(vhost, name, body.get("pattern", ""),
                                         body.get("apply-to", "all"),
                                         body.get("priority", 0), body.get("definition", {})))
        except ValueError as error:
            raise bad_request(str(error)) from None
        return Response(201)
    if not gateway.catalogue.delete_policy(vhost, name):  # DELETE
        raise not_found()
    return Response(204)


async def operator_policies(management, request: Request, rest: list[str]) -> Response:
    """None: Warren has no operator policies (an import refuses them)."""
    require_admin(request)
    return listed(request, [])


async def parameters(management, request: Request, rest: list[str]) -> Response:
    """RabbitMQ's runtime parameters: here only vhost limits are, as there."""
    return listed(request, limits.as_parameters(management, request))
