"""/metrics and /metrics/per-object against a real broker, read with
prometheus_client's parser: RabbitMQ's metric names (those its Grafana
dashboards query) with the values a client's traffic leaves."""

from __future__ import annotations

import base64
import urllib.request

import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..support.broker import RunningBroker, managed_broker, wait_until
from .test_management_api import call, connect

# What RabbitMQ's "RabbitMQ-Overview" Grafana dashboard and the issue name.
RABBITMQ_NAMES = [
    "rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers", "rabbitmq_queues",
    "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked", "rabbitmq_queue_messages",
    "rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
    "rabbitmq_global_messages_confirmed_total", "rabbitmq_global_messages_routed_total",
    "rabbitmq_global_messages_unroutable_dropped_total",
    "rabbitmq_global_messages_unroutable_returned_total",
    "rabbitmq_global_messages_received_confirm_total",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_connections_opened_total", "rabbitmq_connections_closed_total",
    "rabbitmq_channels_opened_total", "rabbitmq_channels_closed_total",
    "rabbitmq_queues_declared_total", "rabbitmq_queues_created_total",
    "rabbitmq_queues_deleted_total",
    "rabbitmq_resident_memory_limit_bytes", "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_disk_space_available_limit_bytes", "rabbitmq_disk_space_available_bytes",
    "rabbitmq_alarms_memory_used_watermark", "rabbitmq_alarms_free_disk_space_watermark",
    "rabbitmq_build_info", "rabbitmq_identity_info",
    # what the RabbitMQ-Overview dashboard charts besides
    "rabbitmq_channel_messages_published_total", "rabbitmq_channel_messages_confirmed_total",
    "rabbitmq_channel_messages_delivered_total", "rabbitmq_channel_messages_delivered_ack_total",
    "rabbitmq_channel_get_total", "rabbitmq_channel_get_ack_total",
    "rabbitmq_channel_get_empty_total", "rabbitmq_channel_messages_redelivered_total",
    "rabbitmq_channel_messages_acked_total", "rabbitmq_channel_messages_unroutable_dropped_total",
    "rabbitmq_channel_messages_unroutable_returned_total", "rabbitmq_channel_consumers",
    "rabbitmq_channel_messages_unacked", "rabbitmq_process_open_fds", "rabbitmq_process_max_fds",
]


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "metrics", shards=2)


def scrape(broker, path: str = "/metrics") -> dict[str, list]:
    """Sample name -> [(labels, value)]."""
    with urllib.request.urlopen(broker.http_url + path, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict, name: str, **labels) -> float:
    found = [v for got, v in samples.get(name, []) if labels.items() <= got.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_rabbitmq_names_and_values_after_traffic(managed):
    before = scrape(managed)
    opened = value(before, "rabbitmq_connections_opened_total")
    conn = connect(managed)
    ch = conn.channel()
    ch.confirm_delivery()  # each publish below returns once the broker confirmed it
    ch.queue_declare("metered")
    for body in (b"1", b"2", b"3", b"4"):
        ch.basic_publish("", "metered", body)
    ch.basic_publish("amq.direct", "nowhere", b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", "nowhere", b"returned", mandatory=True)
    method, _, _ = ch.basic_get("metered")
    ch.basic_ack(method.delivery_tag)
    ch.basic_get("metered")  # left unacknowledged

    def settled():
        samples = scrape(managed)
        return samples if value(samples, "rabbitmq_queue_messages_ready") == 2 and value(
            samples, "rabbitmq_global_messages_acknowledged_total", protocol="amqp091") == 1 \
            else None
    samples = wait_until(settled)
    for name in RABBITMQ_NAMES:
        assert name in samples, name
    assert value(samples, "rabbitmq_queue_messages_unacked") == 1
    assert value(samples, "rabbitmq_queue_messages") == 3
    assert value(samples, "rabbitmq_queue_messages_published_total") == 4
    assert value(samples, "rabbitmq_connections") == 1
    assert value(samples, "rabbitmq_channels") == 1
    assert value(samples, "rabbitmq_consumers") == 0
    assert value(samples, "rabbitmq_queues") == 1
    assert value(samples, "rabbitmq_queues_declared_total") == 1
    assert value(samples, "rabbitmq_queues_created_total") == 1
    assert value(samples, "rabbitmq_queues_deleted_total") == 0
    assert value(samples, "rabbitmq_connections_opened_total") == opened + 1
    amqp = {"protocol": "amqp091"}
    assert value(samples, "rabbitmq_global_messages_received_total", **amqp) == 6
    assert value(samples, "rabbitmq_global_messages_received_confirm_total", **amqp) == 6
    assert value(samples, "rabbitmq_global_messages_routed_total", **amqp) == 4
    assert value(samples, "rabbitmq_global_messages_unroutable_dropped_total", **amqp) == 1
    assert value(samples, "rabbitmq_global_messages_unroutable_returned_total", **amqp) == 1
    assert value(samples, "rabbitmq_global_messages_confirmed_total", **amqp) == 6
    assert value(samples, "rabbitmq_global_messages_delivered_total", **amqp) == 2
    assert value(samples, "rabbitmq_global_messages_delivered_get_manual_ack_total", **amqp) == 2
    assert value(samples, "rabbitmq_channel_get_ack_total") == 2
    assert value(samples, "rabbitmq_channel_messages_published_total") == 6
    assert value(samples, "rabbitmq_channel_messages_acked_total") == 1
    assert value(samples, "rabbitmq_channel_messages_unacked") == 1
    assert value(samples, "rabbitmq_process_resident_memory_bytes") > 0
    assert value(samples, "rabbitmq_disk_space_available_bytes") > 0
    assert value(samples, "rabbitmq_alarms_memory_used_watermark") == 0
    assert value(samples, "rabbitmq_alarms_free_disk_space_watermark") == 0
    identity = samples["rabbitmq_identity_info"][0][0]
    assert identity["rabbitmq_node"].startswith("warren@") and identity["rabbitmq_cluster"]
    assert samples["rabbitmq_build_info"][0][0]["product"] == "Warren"
    # Warren's own: one series per shard and per process
    assert {labels["shard"] for labels, _ in samples["warren_shard_fsyncs_total"]} == {"0", "1"}
    assert {labels["process"] for labels, _ in
            samples["warren_process_resident_memory_bytes"]} == {"gateway", "shard-0", "shard-1"}

    per_object = scrape(managed, "/metrics/per-object")
    queue = {"vhost": "/", "queue": "metered"}
    assert value(per_object, "rabbitmq_queue_messages_ready", **queue) == 2
    assert value(per_object, "rabbitmq_queue_messages_unacked", **queue) == 1
    assert value(per_object, "rabbitmq_queue_messages_published_total", **queue) == 4
    assert value(per_object, "rabbitmq_global_messages_routed_total", **amqp) == 4
    ch.queue_delete("metered")
    assert value(scrape(managed), "rabbitmq_queues_deleted_total") == 1
    assert value(scrape(managed), "rabbitmq_queues") == 0
    conn.close()
    wait_until(lambda: value(scrape(managed), "rabbitmq_connections_closed_total") >= 1)


def test_metrics_need_no_login_as_rabbitmqs_plugin_by_default(managed):
    # every vhost's queues, to anyone who can reach the port (document it)
    with urllib.request.urlopen(managed.http_url + "/metrics/per-object", timeout=10) as answer:
        assert answer.status == 200


def test_prometheus_authentication_asks_for_a_monitoring_user(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1, management=True,
                           extra_args=["--prometheus-authentication"]).start()
    try:
        call(broker, "PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})
        call(broker, "PUT", "/api/users/manager", {"password": "pw", "tags": "management"})
        call(broker, "PUT", "/api/users/plain", {"password": "pw", "tags": ""})
        for path in ("/metrics", "/metrics/per-object"):
            assert call(broker, "GET", path, user=None)[0] == 401
            assert call(broker, "GET", path, user="watcher", password="no")[0] == 401
            for user in ("manager", "plain"):
                assert call(broker, "GET", path, user=user, password="pw") == (
                    401, {"error": "not_authorised", "reason": "Not monitor user"})
            for user, password in (("watcher", "pw"), ("guest", "guest")):
                request = urllib.request.Request(broker.http_url + path, headers={
                    "Authorization": "Basic " + base64.b64encode(
                        f"{user}:{password}".encode()).decode()})
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert b"rabbitmq_queues" in answer.read()
    finally:
        broker.stop()
