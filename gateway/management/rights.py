"""What each of RabbitMQ's user tags may do through the management API, as its
management plugin decides it (its 401s). Every tag includes the rights of
"management": policymakers also manage their vhosts' policies; monitors also see
every vhost, connection and channel and the node; administrators can do anything."""

from __future__ import annotations

from .http import Request, not_authorised

MANAGEMENT_TAGS = {"management", "policymaker", "monitoring", "administrator"}


def is_admin(user) -> bool:
    return "administrator" in user.tags


def is_monitor(user) -> bool:
    return "monitoring" in user.tags or is_admin(user)


def is_policymaker(user) -> bool:
    return "policymaker" in user.tags or is_admin(user)


def require_admin(request: Request) -> None:
    if not is_admin(request.user):
        raise not_authorised("Not administrator user")


def require_monitor(request: Request) -> None:
    if not is_monitor(request.user):
        raise not_authorised("Not monitor user")
