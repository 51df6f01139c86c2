"""Access control: users, their vhost permissions and limits, kept durably in the
metadata store and checked on connection.open and on every resource a channel
touches, with RabbitMQ's refusals."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from warren.storage.metastore import MetaStore, PermissionDef, UserDef

from ..amqp import spec
from ..errors import AMQPError
from . import auth, changes
from .peermessages import LoginFailed, LoginTurn

log = logging.getLogger("warren.access")

FULL_ACCESS = ".*"


class AccessControl:
    def __init__(self, meta: MetaStore | None, loopback_users: list[str] | None = None,
                 changed=None):
        self.meta = meta
        self._changed = changed or (lambda change: None)  # for the other gateways
        self.loopback_users = set(loopback_users if loopback_users is not None else ["guest"])
        self.users: dict[str, UserDef] = {}
        self.permissions: dict[tuple[str, str], PermissionDef] = {}  # (user, vhost) ->
        # (user, vhost, access, kind, name) -> allowed; publishes check every message,
        # so decisions are remembered until a permission changes
        self._decisions: dict[tuple, bool] = {}
        # The broker's one throttle of failed logins (AMQP and management alike),
        # in the root; another gateway asks it over the control link (`root`, its
        # Leader), and only about failures and about the addresses it throttles.
        self.throttle = auth.LoginThrottle()
        self.root = None
        # on another gateway: the addresses the root said it throttles -> when
        self._throttled: OrderedDict[str, float] = OrderedDict()

    def load(self, users: list[UserDef], permissions: list[PermissionDef]) -> None:
        self.users = {u.name: u for u in users}
        self.permissions = {(p.user, p.vhost): p for p in permissions}
        self._decisions.clear()

    def ensure_default(self, user: str, password: str, vhost: str) -> None:
        """A fresh data directory gets the default user, an administrator with full
        permissions on the default vhost (RabbitMQ's default_user/default_pass)."""
        if not self.users:
            self.put_user(user, password, ["administrator"])
            self.set_permissions(user, vhost, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)

    # -- changes ---------------------------------------------------------------

    def put_user(self, name: str, password: str | None, tags: list[str],
                 password_hash: str | None = None, limits: dict | None = None) -> UserDef:
        existing = self.users.get(name)
        if password is not None:
            password_hash = auth.hash_password(password)
        elif password_hash is None:
            password_hash = existing.password_hash if existing else ""
        user = UserDef(name, password_hash, list(tags),
                       limits if limits is not None else (existing.limits if existing else {}))
        self.users[name] = user
        if self.meta is not None:
            self.meta.put_user(user)
        self._changed(changes.UserPut(user))
        return user

    def delete_user(self, name: str) -> bool:
        if self.users.pop(name, None) is None:
            return False
        for key in [k for k in self.permissions if k[0] == name]:
            self.clear_permissions(*key)
        if self.meta is not None:
            self.meta.delete_user(name)
        self._changed(changes.UserDeleted(name))
        return True

    def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                        read: str) -> None:
        permission = PermissionDef(user, vhost, configure, write, read)
        self.permissions[(user, vhost)] = permission
        self._decisions.clear()
        if self.meta is not None:
            self.meta.put_permission(permission)
        self._changed(changes.PermissionPut(permission))

    def grant_creator(self, user: str, vhost: str) -> None:
        """Full permissions on a new vhost for the user who created it, as RabbitMQ
        gives them, so that it may use the vhost at once."""
        if user in self.users:
            self.set_permissions(user, vhost, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)

    def clear_permissions(self, user: str, vhost: str) -> bool:
        if self.permissions.pop((user, vhost), None) is None:
            return False
        self._decisions.clear()
        if self.meta is not None:
            self.meta.delete_permission(user, vhost)
        self._changed(changes.PermissionDeleted(user, vhost))
        return True

    def forget_vhost(self, vhost: str) -> None:
        for key in [k for k in self.permissions if k[1] == vhost]:
            del self.permissions[key]  # the metastore drops them with the vhost
        self._decisions.clear()

    # -- decisions -------------------------------------------------------------

    def refusal(self, name, password, peer_host: str) -> str | None:
        """Why a login is refused (RabbitMQ's words), or None when the password is
        right and the user may log in from there (users in loopback_users, guest
        by default, only from loopback)."""
        # (AMQPLAIN's field table may carry any type)
        user = self.users.get(name) if isinstance(name, str) else None
        if user is None or not isinstance(password, str) or not auth.check_password(
                user.password_hash, password):
            return "invalid credentials"
        if name in self.loopback_users and not auth.is_loopback(peer_host):
            return f"user '{name}' can only connect via localhost"
        return None

    def must_wait(self, peer_host: str) -> bool:
        """Is `peer_host` throttled: must a login from there wait its turn
        (`login_turn`) before its password is checked? Any other is checked at once."""
        if self.root is None:
            return self.throttle.throttled(peer_host)
        told = self._throttled.get(peer_host)
        return told is not None and time.monotonic() - told < self.throttle.forget_after

    def login_turn(self, peer_host: str, answered) -> None:
        """`answered(wait)`: seconds until a login from a throttled address may be
        checked, or None to refuse it unchecked (its turn is too far off)."""
        if self.root is None:
            answered(self.throttle.turn(peer_host))
        else:
            self.root.request(lambda req: LoginTurn(req, peer_host),
                              lambda reply: self._heard(peer_host, reply, answered))

    def login_failed(self, name, reason: str, peer_host: str, mechanism: str,
                     at_turn: bool, waited: float, answered) -> None:
        """Count a refused login with the broker's throttle and log it (in RabbitMQ's
        words, with the address); `answered(delay)`: seconds to wait before
        answering it. `waited`: the seconds it waited for its turn."""
        def logged(delay: float) -> None:
            self._log_refusal(name, reason, peer_host, mechanism, waited + delay)
            answered(delay)

        if self.root is None:
            logged(self.throttle.failed(peer_host, at_turn))
        else:
            self.root.request(lambda req: LoginFailed(req, peer_host, at_turn),
                              lambda reply: self._heard(peer_host, reply, logged))

    def _heard(self, peer_host: str, reply, answered) -> None:
        """The root's answer about `peer_host` (a LoginWait), which says whether it
        throttles the address now."""
        self._throttled.pop(peer_host, None)
        if reply.throttled:
            self._throttled[peer_host] = time.monotonic()
            if len(self._throttled) > self.throttle.max_addresses:
                self._throttled.popitem(last=False)
        answered(None if reply.wait < 0 else reply.wait)

    @staticmethod
    def _log_refusal(name, reason: str, peer_host: str, mechanism: str,
                     delay: float) -> None:
        refused = "HTTP access denied" if mechanism == "HTTP" else f"{mechanism} login refused"
        log.warning("%s: user '%s' - %s (from %s%s)", refused, name or "", reason, peer_host,
                    f", answered in {round(delay, 2):g}s" if delay else "")

    def may_use_vhost(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self.permissions

    def check(self, user: str, vhost: str, access: str, kind: str, name: str) -> None:
        """403 ACCESS_REFUSED unless `user` has `access` ('configure', 'write' or
        'read') to the queue or exchange `name`."""
        key = (user, vhost, access, kind, name)
        allowed = self._decisions.get(key)
        if allowed is None:
            permission = self.permissions.get((user, vhost))
            allowed = permission is not None and auth.permits(
                getattr(permission, access), auth.permission_resource_name(kind, name))
            if len(self._decisions) > 100_000:
                self._decisions.clear()
            self._decisions[key] = allowed
        if not allowed:
            resource = auth.permission_resource_name(kind, name)
            raise AMQPError(spec.ACCESS_REFUSED,
                            f"access to {kind} '{resource}' in vhost '{vhost}' refused for "
                            f"user '{user}'")

    def user_limit(self, user: str, limit: str) -> int:
        """A user's max-connections or max-channels (-1: no limit)."""
        found = self.users.get(user)
        value = found.limits.get(limit, -1) if found else -1
        return value if isinstance(value, int) else -1
