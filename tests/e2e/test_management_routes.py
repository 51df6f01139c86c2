"""The management API's routes are matched whole: every route with every method
it does not take answers RabbitMQ's 405 (no body, an Allow header), and any path
under a route that no route names answers RabbitMQ's 404, without touching the
route's object (DELETE /api/vhosts/V/deletion/protection deleted the vhost).
RabbitMQ's sub-resources that clients use are served as RabbitMQ 3.10.8 shapes
them, as are its health checks; a vhost's creator gets full permissions on it;
count may be a decimal string and arguments an empty array (rabbitmqadmin's and
pyrabbit2's bodies)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from urllib.parse import quote, unquote

import pika
import pytest

from warren.gateway.management import health, routes

from ..support.broker import managed_broker, wait_until

METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH")
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "routes")


def call(broker, method: str, path: str, body=None, user: str = "guest",
         password: str = "guest"):
    """(status, decoded JSON or None, headers) of an API call."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(
        broker.http_url + path, method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Basic {auth}"},
        data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None), response.headers
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, (json.loads(raw) if raw else None), error.headers


def get(broker, path: str, **kwargs):
    status, body, _ = call(broker, "GET", path, **kwargs)
    assert status == 200, (path, status, body)
    return body


# -- the table, against a broker (tests/unit/test_management_routes.py: in-process) -----


def fits(pattern: tuple[str, ...], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(p in ("*", part) for p, part in zip(pattern, parts))


@pytest.fixture(scope="module")
def world(managed):
    """Objects of every kind the routes name, and a client connection with a channel."""
    call(managed, "PUT", "/api/vhosts/r-v")
    call(managed, "PUT", "/api/users/r-u", {"password": "pw", "tags": "management"})
    call(managed, "PUT", "/api/permissions/r-v/r-u", {"configure": ".*", "write": ".*",
                                                      "read": ".*"})
    call(managed, "PUT", "/api/queues/r-v/r-q", {"durable": True})
    call(managed, "PUT", "/api/queues/r-v/r-qq", {"durable": True,
                                                  "arguments": {"x-queue-type": "quorum"}})
    call(managed, "PUT", "/api/exchanges/r-v/r-x", {"type": "direct"})
    call(managed, "PUT", "/api/exchanges/r-v/r-x2", {"type": "fanout"})
    call(managed, "POST", "/api/bindings/r-v/e/r-x/q/r-q", {"routing_key": "k"})
    call(managed, "POST", "/api/bindings/r-v/e/r-x/e/r-x2", {"routing_key": "k2"})
    call(managed, "PUT", "/api/policies/r-v/r-p", {"pattern": "^none$",
                                                   "definition": {"max-length": 5}})
    call(managed, "PUT", "/api/vhost-limits/r-v/max-queues", {"value": 100})
    call(managed, "PUT", "/api/user-limits/r-u/max-channels", {"value": 100})
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://r-u:pw@127.0.0.1:{managed.port}/r-v"))
    channel = conn.channel()
    channel.basic_publish("r-x", "k", b"kept")
    connection = wait_until(lambda: get(managed, "/api/vhosts/r-v/connections"))[0]["name"]
    yield {"connection": connection, "channel": f"{connection} (1)", "conn": conn}
    conn.close()


def sample_paths(broker, world) -> dict[tuple[str, ...], str]:
    """A path of each route, naming the world's objects."""
    conn, chan = quote(world["connection"], safe=""), quote(world["channel"], safe="")
    samples = {
        "overview": "overview", "cluster-name": "cluster-name", "extensions": "extensions",
        "whoami": "whoami", "nodes": "nodes", "nodes/*": "nodes/" + get(broker, "/api/nodes")[0]["name"],
        "vhosts": "vhosts", "vhosts/*": "vhosts/r-v",
        "vhosts/*/permissions": "vhosts/r-v/permissions",
        "vhosts/*/topic-permissions": "vhosts/r-v/topic-permissions",
        "vhosts/*/connections": "vhosts/r-v/connections",
        "vhosts/*/channels": "vhosts/r-v/channels",
        "users": "users", "users/*": "users/r-u", "users/*/permissions": "users/r-u/permissions",
        "users/*/topic-permissions": "users/r-u/topic-permissions",
        "permissions": "permissions", "permissions/*/*": "permissions/r-v/r-u",
        "queues": "queues", "queues/*": "queues/r-v", "queues/*/*": "queues/r-v/r-q",
        "queues/*/*/contents": "queues/r-v/r-q/contents", "queues/*/*/get": "queues/r-v/r-q/get",
        "queues/*/*/bindings": "queues/r-v/r-q/bindings",
        "quorum-status/*/*": "quorum-status/r-v/r-qq",
        "quorum-members/*/*/*": "quorum-members/r-v/r-qq/n",
        "quorum-grow/*": "quorum-grow/n", "quorum-shrink/*": "quorum-shrink/n",
        "exchanges": "exchanges", "exchanges/*": "exchanges/r-v",
        "exchanges/*/*": "exchanges/r-v/r-x", "exchanges/*/*/publish": "exchanges/r-v/r-x/publish",
        "exchanges/*/*/bindings/source": "exchanges/r-v/r-x/bindings/source",
        "exchanges/*/*/bindings/destination": "exchanges/r-v/r-x2/bindings/destination",
        "bindings": "bindings", "bindings/*": "bindings/r-v",
        "bindings/*/e/*/q/*": "bindings/r-v/e/r-x/q/r-q",
        "bindings/*/e/*/e/*": "bindings/r-v/e/r-x/e/r-x2",
        "bindings/*/e/*/q/*/*": "bindings/r-v/e/r-x/q/r-q/k",
        "bindings/*/e/*/e/*/*": "bindings/r-v/e/r-x/e/r-x2/k2",
        "connections": "connections", "connections/*": f"connections/{conn}",
        "connections/*/channels": f"connections/{conn}/channels",
        "channels": "channels", "channels/*": f"channels/{chan}",
        "consumers": "consumers", "consumers/*": "consumers/r-v",
        "policies": "policies", "policies/*": "policies/r-v", "policies/*/*": "policies/r-v/r-p",
        "definitions": "definitions", "definitions/*": "definitions/r-v",
        "vhost-limits": "vhost-limits", "vhost-limits/*": "vhost-limits/r-v",
        "vhost-limits/*/*": "vhost-limits/r-v/max-queues",
        "user-limits": "user-limits", "user-limits/*": "user-limits/r-u",
        "user-limits/*/*": "user-limits/r-u/max-channels",
        "parameters": "parameters", "operator-policies": "operator-policies",
        "topic-permissions": "topic-permissions",
        "aliveness-test/*": "aliveness-test/r-v", "healthchecks/node": "healthchecks/node",
        "health/checks/port-listener/*": f"health/checks/port-listener/{broker.port}",
        "health/checks/protocol-listener/*": "health/checks/protocol-listener/amqp",
        "health/checks/certificate-expiration/*/*":
            "health/checks/certificate-expiration/1/weeks",
    }
    for name in ("alarms", "local-alarms", "virtual-hosts", "node-is-quorum-critical",
                 "node-is-mirror-sync-critical"):
        samples[f"health/checks/{name}"] = f"health/checks/{name}"
    return {tuple(key.split("/")): "/api/" + path for key, path in samples.items()}


def state(broker) -> dict:
    """What a wrong call could change: the definitions, the messages, the connections."""
    return {"definitions": get(broker, "/api/definitions"),
            "messages": [(q["name"], q["messages"]) for q in get(broker, "/api/queues")],
            "connections": sorted(c["name"] for c in get(broker, "/api/connections"))}


def test_every_route_takes_its_methods_only_and_nothing_under_it(managed, world):
    paths = sample_paths(managed, world)
    assert set(paths) == {route.pattern for route in routes.ROUTES}, "a route has no sample"
    before = state(managed)
    for route in routes.ROUTES:
        path = paths[route.pattern]
        if "GET" in route.methods:
            status, body, _ = call(managed, "GET", path)
            assert status == 200, (path, status, body)
        taken = {m for r in routes.ROUTES if r.pattern == route.pattern for m in r.methods}
        for method in METHODS:
            if method not in taken:
                status, body, headers = call(managed, method, path, {})
                assert (status, body) == (405, None), (method, path, status, body)
                assert headers["Allow"] == routes.allow_header(tuple(taken))
            for suffix in ("zz", "zz/zz", "deletion/protection", "permissions/x", "%2F"):
                under = f"{path}/{suffix}"
                if any(fits(r.pattern, [unquote(p) for p in under.split("/")[2:]])
                       for r in routes.ROUTES):
                    continue  # another route's path (nodes/zz), not one under this one
                status, body, _ = call(managed, method, under, {})
                assert (status, body) == (404, NOT_FOUND), (method, path, suffix, status)
    assert state(managed) == before


def test_head_and_options_as_rabbitmq_s(managed, world):
    status, body, headers = call(managed, "HEAD", "/api/vhosts/r-v")
    assert (status, body) == (200, None) and int(headers["Content-Length"]) > 0
    assert call(managed, "HEAD", "/api/vhosts/nowhere")[0] == 404
    assert call(managed, "HEAD", "/api/queues/r-v/r-q/get")[0] == 405
    before = state(managed)
    # OPTIONS needs no credentials (browsers' CORS preflights send none)
    status, body, headers = call(managed, "OPTIONS", "/api/vhosts/r-v", user="", password="")
    assert (status, body, headers["Allow"]) == (200, None, "HEAD, GET, PUT, DELETE, OPTIONS")
    assert call(managed, "OPTIONS", "/api/queues/r-v/r-q/get")[2]["Allow"] == "POST, OPTIONS"
    assert call(managed, "OPTIONS", "/api/vhosts/r-v/zz")[:2] == (404, NOT_FOUND)
    assert state(managed) == before


def test_the_issue_s_calls_touch_nothing(managed, world):
    before = state(managed)
    assert call(managed, "DELETE", "/api/vhosts/r-v/deletion/protection")[:2] == (404, NOT_FOUND)
    assert call(managed, "DELETE", "/api/users/r-u/permissions")[0] == 405
    assert call(managed, "DELETE", "/api/exchanges/r-v/r-x/bindings/source")[0] == 405
    assert call(managed, "PUT", "/api/queues/r-v/r-q/bindings", {})[0] == 405
    assert state(managed) == before
    assert "password_hash" not in json.dumps(get(managed, "/api/users/r-u/permissions"))


# -- the sub-resources, as RabbitMQ 3.10.8 answers them ------------------------------------

def test_permissions_of_a_user_and_of_a_vhost(managed, world):
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert get(managed, "/api/users/r-u/permissions") == [{"user": "r-u", "vhost": "r-v", **full}]
    assert {"user": "r-u", "vhost": "r-v", **full} in get(managed, "/api/vhosts/r-v/permissions")
    assert get(managed, "/api/users/r-u/topic-permissions") == []
    assert get(managed, "/api/topic-permissions") == []
    assert get(managed, "/api/operator-policies") == []
    # RabbitMQ lists a vhost's limits among its runtime parameters
    assert {"value": {"max-queues": 100}, "vhost": "r-v", "component": "vhost-limits",
            "name": "limits"} in get(managed, "/api/parameters")
    assert get(managed, "/api/vhosts/r-v/topic-permissions") == []
    for path in ("users/nobody/permissions", "users/nobody/topic-permissions",
                 "vhosts/nowhere/permissions", "vhosts/nowhere/topic-permissions",
                 "vhosts/nowhere/connections", "vhosts/nowhere/channels"):
        assert call(managed, "GET", f"/api/{path}")[:2] == (404, NOT_FOUND), path
    # administrators only, as RabbitMQ's
    assert call(managed, "GET", "/api/users/r-u/permissions", user="r-u", password="pw")[0] == 401


def test_connections_and_channels_of_a_vhost_and_of_a_connection(managed, world):
    name = world["connection"]
    assert [c["name"] for c in get(managed, "/api/vhosts/r-v/connections")] == [name]
    assert get(managed, "/api/vhosts/%2F/connections") == []
    channels = get(managed, f"/api/connections/{quote(name, safe='')}/channels")
    assert [c["name"] for c in channels] == [world["channel"]]
    assert channels[0]["connection_details"]["name"] == name
    assert [c["name"] for c in get(managed, "/api/vhosts/r-v/channels")] == [world["channel"]]
    one = get(managed, f"/api/channels/{quote(world['channel'], safe='')}")
    assert one["name"] == world["channel"] and one["vhost"] == "r-v"
    assert call(managed, "GET", "/api/connections/nobody/channels")[:2] == (404, NOT_FOUND)
    assert call(managed, "GET", "/api/channels/nobody%20(1)")[:2] == (404, NOT_FOUND)


def binding(source, destination, kind, key):
    return {"source": source, "vhost": "r-v", "destination": destination,
            "destination_type": kind, "routing_key": key, "arguments": {},
            "properties_key": key}


def test_bindings_of_a_queue_and_of_an_exchange(managed, world):
    to_queue = binding("r-x", "r-q", "queue", "k")
    to_exchange = binding("r-x", "r-x2", "exchange", "k2")
    assert get(managed, "/api/queues/r-v/r-q/bindings") == [
        binding("", "r-q", "queue", "r-q"), to_queue]
    assert get(managed, "/api/exchanges/r-v/r-x/bindings/source") == [to_queue, to_exchange]
    assert get(managed, "/api/exchanges/r-v/r-x/bindings/destination") == []
    assert get(managed, "/api/exchanges/r-v/r-x2/bindings/destination") == [to_exchange]
    assert get(managed, "/api/bindings/r-v/e/r-x/q/r-q") == [to_queue]
    assert get(managed, "/api/bindings/r-v/e/r-x/q/r-q/k") == to_queue
    assert get(managed, "/api/bindings/r-v/e/r-x/e/r-x2/k2") == to_exchange
    for path in ("queues/r-v/nope/bindings", "exchanges/r-v/nope/bindings/source",
                 "bindings/r-v/e/r-x/q/r-q/other"):
        assert call(managed, "GET", f"/api/{path}")[:2] == (404, NOT_FOUND), path


def test_a_vhost_s_definitions_as_rabbitmq_s(managed, world):
    exported = get(managed, "/api/definitions/r-v")
    assert set(exported) == {"rabbit_version", "parameters", "policies", "queues",
                             "exchanges", "bindings"}
    assert {"name": "r-q", "durable": True, "auto_delete": False, "arguments": {}} in \
        exported["queues"]
    assert exported["policies"][0]["vhost"] == "r-v"  # policies keep theirs, as there
    exported["queues"] = [{**q, "name": "r-imported"} for q in exported["queues"]]
    assert call(managed, "POST", "/api/definitions/r-v", exported)[:2] == (204, None)
    assert get(managed, "/api/queues/r-v/r-imported")["vhost"] == "r-v"
    call(managed, "DELETE", "/api/queues/r-v/r-imported")
    assert call(managed, "GET", "/api/definitions/nowhere")[:2] == (
        400, {"error": "bad_request", "reason": "vhost_not_found"})
    assert call(managed, "POST", "/api/definitions/nowhere", {})[:2] == (
        404, {"error": "not_found", "reason": "vhost_not_found"})


# -- clients' bodies ---------------------------------------------------------------------

def test_an_empty_array_is_no_arguments_and_count_may_be_a_string(managed, world):
    assert call(managed, "PUT", "/api/exchanges/r-v/r-args",
                {"type": "direct", "arguments": []})[0] == 201
    call(managed, "PUT", "/api/queues/r-v/r-args-q", {})
    assert call(managed, "POST", "/api/bindings/r-v/e/r-args/q/r-args-q",
                {"routing_key": "a", "arguments": []})[0] == 201
    assert get(managed, "/api/exchanges/r-v/r-args")["arguments"] == {}
    status, body, _ = call(managed, "PUT", "/api/exchanges/r-v/r-args2",
                           {"type": "direct", "arguments": [1]})
    assert (status, body["reason"]) == (400, "arguments must be an object")
    call(managed, "POST", "/api/exchanges/r-v/amq.default/publish",
         {"routing_key": "r-args-q", "payload": "one", "payload_encoding": "string",
          "properties": {}})
    status, got, _ = call(managed, "POST", "/api/queues/r-v/r-args-q/get",
                          {"count": "1", "ackmode": "ack_requeue_true", "encoding": "auto",
                           "truncate": "50000"})
    assert status == 200 and len(got) == 1
    status, body, _ = call(managed, "POST", "/api/queues/r-v/r-args-q/get",
                           {"count": "x", "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert (status, body) == (400, {"error": "bad_request", "reason": ["not_integer", "x"]})


def test_a_vhost_s_creator_may_use_it_at_once(managed, world):
    call(managed, "PUT", "/api/users/r-admin", {"password": "pw", "tags": "administrator"})
    assert call(managed, "PUT", "/api/vhosts/r-new", user="r-admin", password="pw")[0] == 201
    assert get(managed, "/api/permissions/r-new/r-admin") == {
        "user": "r-admin", "vhost": "r-new", "configure": ".*", "write": ".*", "read": ".*"}
    assert call(managed, "PUT", "/api/exchanges/r-new/x", {"type": "fanout"}, user="r-admin",
                password="pw")[0] == 201
    # a vhost that exists keeps its permissions as they are
    call(managed, "DELETE", "/api/permissions/r-new/r-admin")
    assert call(managed, "PUT", "/api/vhosts/r-new", user="r-admin", password="pw")[0] == 204
    assert call(managed, "GET", "/api/permissions/r-new/r-admin")[0] == 404
    call(managed, "DELETE", "/api/vhosts/r-new")


# -- health checks ----------------------------------------------------------------------

def test_health_checks_answer_as_rabbitmq_s(managed, world):
    port, http_port = managed.port, managed.listener_port("http")
    checks = "/api/health/checks"
    assert get(managed, f"{checks}/port-listener/{port}") == {"status": "ok", "port": port}
    status, body, _ = call(managed, "GET", f"{checks}/port-listener/1")
    assert (status, body) == (503, {"status": "failed", "reason": "No active listener",
                                    "missing": 1, "ports": sorted([port, http_port])})
    status, body, _ = call(managed, "GET", f"{checks}/port-listener/abc")
    assert (status, body) == (400, {"error": "bad_request", "reason": "Invalid port"})
    for asked, protocol in (("amqp", "amqp"), ("amqp091", "amqp"), ("http", "http")):
        assert get(managed, f"{checks}/protocol-listener/{asked}") == {"status": "ok",
                                                                       "protocol": protocol}
    status, body, _ = call(managed, "GET", f"{checks}/protocol-listener/mqtt")
    assert (status, body) == (503, {"status": "failed", "reason": "No active listener",
                                    "missing": "mqtt", "protocols": ["amqp", "http"]})
    assert get(managed, f"{checks}/virtual-hosts") == {"status": "ok"}
    for name in ("node-is-quorum-critical", "node-is-mirror-sync-critical"):
        assert get(managed, f"{checks}/{name}") == {"status": "ok",
                                                    "reason": "single node cluster"}
    assert get(managed, f"{checks}/certificate-expiration/1/months") == {"status": "ok"}
    status, body, _ = call(managed, "GET", f"{checks}/certificate-expiration/1/zz")
    assert (status, body["reason"]) == (400, "Time unit not recognised. Supported units: "
                                             "days, weeks, months, years.")
    status, body, _ = call(managed, "GET", f"{checks}/certificate-expiration/x/days")
    assert (status, body["reason"]) == (400, "Invalid expiration value.")


def test_a_certificate_expiring_within_the_time_fails_its_check(certificate):
    cert, _ = certificate  # valid for 2 days
    listeners = [{"node": "n", "protocol": "amqp/ssl", "ip_address": "::", "port": 5671}]
    now = time.time()
    assert json.loads(health.certificate_expiration(listeners, str(cert), "1", "days",
                                                    now).body) == {"status": "ok"}
    expiring = health.certificate_expiration(listeners, str(cert), "1", "weeks", now)
    assert expiring.status == 503
    assert json.loads(expiring.body) == {"status": "failed", "reason": "Certificates expiring",
                                         "expired": [dict(listeners[0], certfile=str(cert))]}
