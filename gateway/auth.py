"""Users, passwords and permissions, the RabbitMQ way.

Password hashes use RabbitMQ's `rabbit_password_hashing_sha256` format:
base64(salt + sha256(salt + password)) with a 4-byte random salt, so users
exported from RabbitMQ's definitions import here unchanged and the other way
round. Permissions are three regular expressions per user and vhost
(configure, write, read) matched anywhere in a resource name, as RabbitMQ's
`re:run` does; an empty expression grants nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
from functools import lru_cache

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


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def permits(pattern: str, name: str) -> bool:
    """Does a permission expression allow resource `name`?"""
    if pattern == "":
        return False
    compiled = _compiled(pattern)
    return compiled is not None and compiled.search(name) is not None


def valid_pattern(pattern: str) -> bool:
    return pattern == "" or _compiled(pattern) is not None


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
