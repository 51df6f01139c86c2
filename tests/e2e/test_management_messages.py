"""What the management API adds for tools and the dashboard: publishing and
getting messages (through an internal connection), list parameters and paged
answers, the cluster name, every listener, connection byte counters and names,
rates from the first seconds; and a RabbitMQ management client from PyPI
(pyrabbit2) working against Warren."""

from __future__ import annotations

import base64

import pika
import pytest
from pyrabbit2.api import Client

from ..support.broker import managed_broker, wait_until
from .test_management_api import call, get


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "messages", shards=2)


def publish(broker, exchange: str, routing_key: str, payload: str, **fields):
    body = {"properties": {}, "routing_key": routing_key, "payload": payload,
            "payload_encoding": "string", **fields}
    return call(broker, "POST", f"/api/exchanges/%2F/{exchange}/publish", body)


def get_messages(broker, queue: str, count: int = 1, ackmode: str = "ack_requeue_false",
                 **fields):
    return call(broker, "POST", f"/api/queues/%2F/{queue}/get",
                {"count": count, "ackmode": ackmode, "encoding": "auto", **fields})


def test_publish_and_get_through_the_api(managed):
    assert call(managed, "PUT", "/api/queues/%2F/api-msgs", {"durable": True})[0] == 201
    status, answer = publish(managed, "amq.default", "api-msgs", "héllo",
                             properties={"content_type": "text/plain", "delivery_mode": 2,
                                         "headers": {"n": 1, "tag": "x"}, "priority": 3})
    assert (status, answer) == (200, {"routed": True})
    raw = base64.b64encode(b"\xff\x00binary").decode()
    assert publish(managed, "amq.direct", "nowhere", "lost")[1] == {"routed": False}
    call(managed, "POST", "/api/bindings/%2F/e/amq.direct/q/api-msgs", {"routing_key": "k"})
    assert publish(managed, "amq.direct", "k", raw, payload_encoding="base64")[1] == \
        {"routed": True}

    # ack_requeue_true: both come back, stay in the queue, marked redelivered after
    status, got = get_messages(managed, "api-msgs", count=5, ackmode="ack_requeue_true")
    assert status == 200 and len(got) == 2
    first, second = got
    assert first["payload"] == "héllo" and first["payload_encoding"] == "string"
    assert first["payload_bytes"] == len("héllo".encode())
    assert first["properties"] == {"content_type": "text/plain", "delivery_mode": 2,
                                   "headers": {"n": 1, "tag": "x"}, "priority": 3}
    assert (first["exchange"], first["routing_key"], first["redelivered"]) == \
        ("", "api-msgs", False)
    assert first["message_count"] == 1
    assert second["payload_encoding"] == "base64" and second["payload"] == raw
    wait_until(lambda: get(managed, "/api/queues/%2F/api-msgs")["messages_ready"] == 2)

    # truncate and base64; ack_requeue_false takes them
    status, got = get_messages(managed, "api-msgs", count=1, encoding="base64", truncate=2)
    assert got[0]["payload"] == base64.b64encode("héllo".encode()[:2]).decode()
    assert got[0]["redelivered"] is True and got[0]["payload_bytes"] == 6
    status, got = get_messages(managed, "api-msgs", count=3, ackmode="reject_requeue_false")
    assert len(got) == 1
    wait_until(lambda: get(managed, "/api/queues/%2F/api-msgs")["messages"] == 0)
    assert get_messages(managed, "api-msgs")[1] == []


@pytest.mark.parametrize("path, body, reason", [
    ("/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                               "properties": {}}, "payload_encoding"),
    ("/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                               "payload_encoding": "base64",
                                               "properties": {}}, "base64"),
    ("/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                               "payload_encoding": "string",
                                               "properties": {"delivery_mode": "2"}},
     "properties.delivery_mode must be an integer"),
    ("/api/exchanges/%2F/amq.direct/publish", {"routing_key": "k", "payload": "x",
                                               "payload_encoding": "string",
                                               "properties": {"colour": "red"}}, "colour"),
    ("/api/queues/%2F/nowhere/get", {"count": 1, "ackmode": "ack_requeue_true"}, "encoding"),
    ("/api/queues/%2F/nowhere/get", {"count": 1, "ackmode": "keep", "encoding": "auto"},
     "ackmode"),
])
def test_bad_publish_and_get_bodies(managed, path, body, reason):
    status, answer = call(managed, "POST", path, body)
    assert status == 400 and answer["error"] == "bad_request" and reason in answer["reason"]


def test_publish_and_get_refusals(managed):
    assert publish(managed, "no-such-x", "k", "x")[0] == 404
    assert get_messages(managed, "no-such-q")[0] == 404
    call(managed, "PUT", "/api/users/reader", {"password": "pw", "tags": "management"})
    call(managed, "PUT", "/api/permissions/%2F/reader",
         {"configure": "", "write": "", "read": "^$"})
    status, _ = call(managed, "POST", "/api/exchanges/%2F/amq.direct/publish",
                     {"routing_key": "k", "payload": "x", "payload_encoding": "string",
                      "properties": {}}, user="reader", password="pw")
    assert status == 401


def test_list_parameters_and_pages(managed):
    for name in ("page-a", "page-b", "page-c", "other"):
        assert call(managed, "PUT", f"/api/queues/%2F/{name}", {})[0] == 201
    page = get(managed, "/api/queues?page=1&page_size=2&name=page-&sort=name"
                        "&sort_reverse=true&columns=name,vhost")
    assert page["items"] == [{"name": "page-c", "vhost": "/"}, {"name": "page-b", "vhost": "/"}]
    assert (page["page"], page["page_size"], page["page_count"], page["item_count"],
            page["filtered_count"]) == (1, 2, 2, 2, 3)
    assert page["total_count"] >= 4
    assert get(managed, "/api/queues/%2F?page=2&page_size=2&name=page-&sort=name"
                        "&columns=name")["items"] == [{"name": "page-c"}]
    assert [q["name"] for q in get(managed, "/api/queues?name=^page-[ab]$&use_regex=true")] \
        == ["page-a", "page-b"]
    assert [x["name"] for x in get(managed, "/api/exchanges/%2F?columns=name&name=amq.f")] == \
        ["amq.fanout"]
    assert call(managed, "GET", "/api/queues?page=0")[1]["reason"] == \
        "Pagination parameters are invalid"
    assert call(managed, "GET", "/api/queues?page=99")[1]["reason"] == "Page out of range"


def test_cluster_name_extensions_and_listeners(managed):
    default = get(managed, "/api/cluster-name")["name"]
    assert default == get(managed, "/api/overview")["cluster_name"]
    assert call(managed, "PUT", "/api/cluster-name", {"name": "orders-broker"})[0] == 204
    assert get(managed, "/api/cluster-name") == {"name": "orders-broker"}
    assert get(managed, "/api/overview")["cluster_name"] == "orders-broker"
    assert get(managed, "/api/extensions") == []
    stats = get(managed, "/api/overview")["message_stats"]
    for name in ("publish", "confirm", "deliver_get", "deliver", "deliver_no_ack", "get",
                 "get_no_ack", "get_empty", "redeliver", "ack", "drop_unroutable",
                 "return_unroutable"):
        assert isinstance(stats[name], int) and "rate" in stats[f"{name}_details"], name
    listeners = {(x["protocol"], x["port"]) for x in get(managed, "/api/overview")["listeners"]}
    assert ("amqp", managed.port) in listeners
    assert ("http", managed.listener_port("http")) in listeners


def test_connection_names_byte_counters_and_rates(managed):
    unnamed = pika.BlockingConnection(pika.URLParameters(managed.url))
    named = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", managed.port, client_properties={"connection_name": "billing"}))
    ch = named.channel()
    ch.queue_declare("rated")

    def billing():
        found = [c for c in get(managed, "/api/connections")
                 if c["user_provided_name"] == "billing"]
        return found[0] if found else None
    info = wait_until(billing)
    assert [c["user_provided_name"] for c in get(managed, "/api/connections")].count(None) == 1
    unnamed.close()
    assert info["recv_oct"] > 0 and info["send_oct"] > 0
    assert info["recv_cnt"] > 0 and info["send_cnt"] > 0
    # rates show within the first seconds of traffic
    ch.confirm_delivery()

    def publish_rate():
        for _ in range(20):
            ch.basic_publish("", "rated", b"x" * 100)
        queue = get(managed, "/api/queues/%2F/rated")
        overview = get(managed, "/api/overview")
        return (queue["message_stats"]["publish_details"]["rate"] > 0
                and overview["message_stats"]["publish_details"]["rate"] > 0
                and billing()["recv_oct_details"]["rate"] > 0)
    wait_until(publish_rate, timeout=5)
    named.close()


def test_pyrabbit2_works_against_warren(managed):
    client = Client(f"127.0.0.1:{managed.listener_port('http')}", "guest", "guest")
    assert client.is_alive()
    client.create_vhost("py-vhost")
    assert "py-vhost" in client.get_vhost_names()
    client.set_vhost_permissions("py-vhost", "guest", ".*", ".*", ".*")
    client.create_queue("py-vhost", "py-q", durable=True)
    assert "py-q" in [q["name"] for q in client.get_queues("py-vhost")]
    assert client.publish("py-vhost", "amq.default", "py-q", "from pyrabbit2") is True
    messages = client.get_messages("py-vhost", "py-q", count=1, requeue=True)
    assert messages[0]["payload"] == "from pyrabbit2"
    messages = client.get_messages("py-vhost", "py-q", count=1)
    assert messages[0]["redelivered"] is True
    assert client.get_messages("py-vhost", "py-q") == []
    assert client.delete_queue("py-vhost", "py-q")
    client.delete_vhost("py-vhost")
    assert "py-vhost" not in client.get_vhost_names()
