"""Users, passwords and permissions, the RabbitMQ way.

Password hashes use RabbitMQ's `rabbit_password_hashing_sha256` format:
base64(salt + sha256(salt + password)) with a 4-byte random salt, so users
exported from RabbitMQ's definitions import here unchanged and the other way
round. Permissions are three regular expressions per user and vhost
(configure, write, read) matched anywhere in a resource name, as RabbitMQ's
`re:run` does, but by RE2 in linear time (patterns.py); an empty expression, or
one RE2 cannot run, grants nothing. Failed logins are counted per
source address to slow down password guessing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict

from . import patterns

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(password_hash: str, password: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (ValueError, TypeError):
        return False
    if len(raw) != 36:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(digest, hashlib.sha256(salt + password.encode()).digest())


def permits(pattern: str, name: str) -> bool:
    """Does a permission expression allow resource `name`?"""
    return pattern != "" and patterns.search(pattern, name)


def is_loopback(host: str) -> bool:
    """A peer address on the loopback interface (IPv4, IPv6 or IPv4-mapped IPv6)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def permission_resource_name(kind: str, name: str) -> str:
    """RabbitMQ checks the default exchange under the name 'amq.default'."""
    return "amq.default" if kind == "exchange" and name == "" else name


class LoginThrottle:
    """Failed logins per source address. After `free` failures, the refusal of
    each further one is to be answered after a delay, doubling from `first` up
    to `cap` seconds, which turns a guesser's thousands of tries per second into
    a few. An address is forgotten `forget_after` seconds after its last
    failure, and at most `max_addresses` are remembered (the longest quiet go
    first), so a flood of addresses cannot exhaust memory."""

    def __init__(self, free: int = 5, first: float = 0.25, cap: float = 4.0,
                 forget_after: float = 300.0, max_addresses: int = 10_000,
                 clock=time.monotonic):
        self.free, self.first, self.cap = free, first, cap
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self.clock = clock
        # address -> (failures, time of the last), the longest quiet first
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def failed(self, address: str) -> float:
        """Count a failed login from `address`: how long to delay its refusal."""
        now = self.clock()
        while self._failures:
            oldest, (_, last) = next(iter(self._failures.items()))
            if now - last < self.forget_after:
                break
            del self._failures[oldest]
        count = self._failures.pop(address, (0, now))[0] + 1
        self._failures[address] = (count, now)
        if len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
        beyond = count - self.free
        # the exponent stops growing long before 2**64 would overflow a float
        return 0.0 if beyond <= 0 else min(self.cap, self.first * 2 ** min(beyond - 1, 64))

    def __len__(self) -> int:
        return len(self._failures)
