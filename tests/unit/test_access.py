"""Who may log in (broker/access.AccessControl, broker/auth): guest only from
loopback, and password hashes as RabbitMQ's, salted SHA-256."""

from __future__ import annotations

import base64
import hashlib

from warren.gateway.broker import auth
from warren.gateway.broker.access import AccessControl


def test_guest_only_from_loopback_decision():
    access = AccessControl(None)
    access.put_user("guest", "guest", [])
    access.put_user("alice", "pw", [])
    assert access.refusal("guest", "guest", "127.0.0.1") is None
    assert access.refusal("guest", "guest", "::1") is None
    assert access.refusal("guest", "guest", "::ffff:127.0.0.1") is None
    assert access.refusal("guest", "guest", "192.0.2.7") == \
        "user 'guest' can only connect via localhost"
    assert access.refusal("alice", "pw", "192.0.2.7") is None
    assert access.refusal("alice", "nope", "127.0.0.1") == "invalid credentials"


def test_password_hashes_are_salted_rabbitmq_sha256():
    first, second = auth.hash_password("s3cret"), auth.hash_password("s3cret")
    assert first != second
    assert auth.check_password(first, "s3cret") and not auth.check_password(first, "S3cret")
    # RabbitMQ's layout: base64(4-byte salt + sha256(salt + password))
    raw = base64.b64decode(first)
    assert len(raw) == 36 and raw[4:] == hashlib.sha256(raw[:4] + b"s3cret").digest()
