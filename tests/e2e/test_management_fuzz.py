"""No input makes the management API answer 500 or log a traceback (issue 56
found lone surrogates, huge integers, long names and keys doing so): hypothesis
over the bodies and names of every endpoint that changes something."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..support.broker import managed_broker
from .test_management_api import call

# Names beyond what AMQP carries, surrogates, NULs, slashes and dots among them.
TEXT = st.one_of(st.text(max_size=12), st.text(st.characters(codec="utf-16"), max_size=6),
                 st.sampled_from(["", ".", "..", "amq.x", "\ud800", "a" * 256, "é" * 200,
                                  "\0", "x/y", ".*", "(a+)+$", "%2F"]))
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | TEXT
    | st.integers(-(1 << 70), 1 << 70) | st.integers(-300, 300),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12)
STRING = TEXT | st.text(max_size=300)
INTEGER = st.integers(-(1 << 70), 1 << 70) | st.integers(-2, 1000)
BOOLEAN = st.booleans() | st.sampled_from(["true", "false", "yes"])
ARGUMENTS = st.dictionaries(st.sampled_from([
    "x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-overflow", "x-queue-type", "x-max-priority",
    "x-single-active-consumer", "x-consumer-timeout", "alternate-exchange", "x-match",
    "max-length", "message-ttl", "dead-letter-exchange", "expires", "ha-mode", "x-a",
    "\ud800"]), JSON | INTEGER | STRING, max_size=4)
PROPERTIES = st.dictionaries(st.sampled_from([
    "content_type", "content_encoding", "headers", "delivery_mode", "priority",
    "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
    "user_id", "app_id", "cluster_id"]), JSON | INTEGER | STRING | ARGUMENTS, max_size=4)


def fields(**kinds) -> st.SearchStrategy:
    """Objects with some of these fields, each of its kind or any JSON value."""
    return st.fixed_dictionaries({}, optional={
        name: st.one_of(kind, JSON) for name, kind in kinds.items()})


def items(**kinds) -> st.SearchStrategy:
    return st.lists(fields(**kinds), max_size=3)


DEFINITIONS = fields(
    users=items(name=STRING, password_hash=STRING, tags=STRING, limits=ARGUMENTS),
    vhosts=items(name=STRING, description=STRING, limits=ARGUMENTS),
    permissions=items(user=STRING, vhost=st.just("h-v"), configure=STRING, write=STRING,
                      read=STRING),
    policies=items(vhost=st.just("h-v"), name=STRING, pattern=STRING, definition=ARGUMENTS,
                   priority=INTEGER),
    queues=items(name=STRING, vhost=st.just("h-v"), durable=BOOLEAN, arguments=ARGUMENTS),
    exchanges=items(name=STRING, vhost=st.just("h-v"), type=STRING, arguments=ARGUMENTS),
    bindings=items(source=STRING, vhost=st.just("h-v"), destination=STRING,
                   routing_key=STRING, arguments=ARGUMENTS),
    parameters=items(vhost=st.just("h-v"), component=STRING, name=STRING, value=ARGUMENTS))
QUEUE = fields(durable=BOOLEAN, auto_delete=BOOLEAN, arguments=ARGUMENTS)
BINDING = fields(routing_key=STRING, arguments=ARGUMENTS)
PUBLISH = fields(properties=PROPERTIES, routing_key=STRING, payload=STRING,
                 payload_encoding=st.sampled_from(["string", "base64", "x"]), mandatory=BOOLEAN)
# (method, path with {} for a name, the bodies its fields make)
ENDPOINTS = [
    ("PUT", "/api/users/h-{}", fields(password=STRING, password_hash=STRING,
                                     tags=STRING | st.lists(STRING))),
    ("PUT", "/api/vhosts/h-{}", fields(description=STRING, tracing=BOOLEAN)),
    ("PUT", "/api/queues/h-v/{}", QUEUE),
    ("PUT", "/api/exchanges/h-v/{}", fields(type=st.sampled_from(
        ["direct", "topic", "fanout", "headers", "x-custom"]) | STRING, durable=BOOLEAN,
        auto_delete=BOOLEAN, internal=BOOLEAN, arguments=ARGUMENTS)),
    ("PUT", "/api/policies/h-v/{}", fields(pattern=STRING, definition=ARGUMENTS,
                                           priority=INTEGER, **{"apply-to": STRING})),
    ("PUT", "/api/permissions/h-v/h-user", fields(configure=STRING, write=STRING, read=STRING)),
    ("PUT", "/api/vhost-limits/h-v/{}", fields(value=INTEGER)),
    ("PUT", "/api/vhost-limits/h-v/max-queues", fields(value=INTEGER)),
    ("PUT", "/api/user-limits/h-user/max-channels", fields(value=INTEGER)),
    ("POST", "/api/bindings/h-v/e/amq.direct/q/{}", BINDING),
    ("POST", "/api/bindings/h-v/e/amq.headers/q/h-q", BINDING),
    ("POST", "/api/exchanges/h-v/{}/publish", PUBLISH),
    ("POST", "/api/exchanges/h-v/amq.default/publish", PUBLISH),
    ("POST", "/api/queues/h-v/{}/get", fields(count=INTEGER, ackmode=st.sampled_from(
        ["ack_requeue_true", "reject_requeue_false"]), encoding=st.just("auto"),
        truncate=INTEGER)),
    ("POST", "/api/definitions", DEFINITIONS),
    ("PUT", "/api/cluster-name", fields(name=STRING)),
    ("DELETE", "/api/queues/h-v/{}", st.just({})),
    ("DELETE", "/api/policies/h-v/{}", st.just({})),
]


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    for broker in managed_broker(tmp_path_factory, "fuzz"):
        call(broker, "PUT", "/api/vhosts/h-v")
        call(broker, "PUT", "/api/users/h-user", {"password": "pw", "tags": ""})
        call(broker, "PUT", "/api/permissions/h-v/guest",
             {"configure": ".*", "write": ".*", "read": ".*"})
        call(broker, "PUT", "/api/queues/h-v/h-q")
        yield broker  # its log is checked for tracebacks when it stops


def send(broker, method: str, path: str, body) -> int:
    request = urllib.request.Request(
        broker.http_url + path, method=method, data=json.dumps(body).encode(), headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_input_gets_a_500(managed, data):
    method, path, bodies = data.draw(st.sampled_from(ENDPOINTS))
    name, body = data.draw(TEXT | st.text(max_size=300)), data.draw(st.one_of(bodies, JSON))
    # a surrogate's UTF-8 bytes in the path: the broker reads them as U+FFFD
    segment = quote(name.encode("utf-8", "surrogatepass"), safe="")
    status = send(managed, method, path.format(segment), body)
    assert status < 500, (method, path, name, body, status)
