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
    """Failed logins per source address, for the whole broker (the root holds it;
    the other gateways ask it over the control link). After `free` failures an
    address is throttled: each further refusal is answered after a delay doubling
    from `first` up to `cap` seconds, and its refusals come one after another, so
    parallel attempts wait their turn instead of sharing one delay; a throttled
    address's attempts are checked only at their turn (`turn`), so holding many
    connections open guesses no faster. Broker-wide, refusals are answered at most
    `per_second` a second, however many addresses fail (beyond that rate no
    failure is free). An address is forgotten `forget_after` seconds after its
    last failure, and at most `max_addresses` are remembered (the longest quiet go
    first), so a flood of addresses cannot exhaust memory; no answer waits more
    than `longest` seconds."""

    def __init__(self, free: int = 5, first: float = 0.25, cap: float = 4.0,
                 forget_after: float = 300.0, max_addresses: int = 10_000,
                 per_second: float = 20.0, longest: float = 30.0, clock=time.monotonic):
        self.free, self.first, self.cap = free, first, cap
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self.spacing = 1.0 / per_second
        self.longest = longest
        self.clock = clock
        # address -> [failures, time of the last, the time of its last refusal or
        # turn (the next comes a delay later)], the longest quiet first
        self._failures: OrderedDict[str, list] = OrderedDict()
        # The broker-wide rate (as a GCRA): the time its refusals so far would take
        # at `per_second`; a second's worth may come at once, the rest waits.
        self._rate_until = 0.0

    def _delay(self, failures: int) -> float:
        beyond = failures - self.free
        # the exponent stops growing long before 2**64 would overflow a float
        return 0.0 if beyond <= 0 else min(self.cap, self.first * 2 ** min(beyond - 1, 64))

    def _forget_quiet(self, now: float) -> None:
        while self._failures:
            oldest, (_, last, turn) = next(iter(self._failures.items()))
            if now - max(last, turn) < self.forget_after:
                break
            del self._failures[oldest]

    def throttled(self, address: str) -> bool:
        """Are its attempts checked only at their turn?"""
        entry = self._failures.get(address)
        return entry is not None and entry[0] >= self.free \
            and self.clock() - max(entry[1], entry[2]) < self.forget_after

    def turn(self, address: str) -> float | None:
        """A login attempt from a throttled address: seconds until its password
        may be checked, a delay after the last refusal or turn (a turn is taken
        as if it fails), or None when that is beyond `longest`: refuse it unchecked."""
        now = self.clock()
        entry = self._failures.get(address)
        if entry is None or entry[0] < self.free:
            return 0.0
        at = max(now, entry[2] + self._delay(entry[0] + 1))
        if at - now > self.longest:
            return None
        entry[0] += 1  # counted now: the turns of parallel attempts come further apart
        entry[2] = at
        return at - now

    def failed(self, address: str, at_turn: bool = False) -> float:
        """Count a failed login from `address`: how long to delay its refusal
        (none if it was checked `at_turn`: that waited, and was counted, already)."""
        now = self.clock()
        self._forget_quiet(now)
        entry = self._failures.pop(address, None) or [0, now, now]
        self._failures[address] = entry
        if len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
        entry[1] = now
        self._rate_until = min(max(self._rate_until, now) + self.spacing, now + self.longest + 1.0)
        rate_at = self._rate_until - 1.0  # when the broker-wide rate lets it be answered
        at = now
        if not at_turn:
            entry[0] += 1
            # over the broker-wide rate (by more than a float's rounding): none is free
            flooded = rate_at - now > self.spacing / 2
            delay = self._delay(max(entry[0], self.free + 1 if flooded else 0))
            at = entry[2] = min(max(now, entry[2] + delay), now + self.longest)
        return min(max(at, rate_at), now + self.longest) - now

    def __len__(self) -> int:
        return len(self._failures)
