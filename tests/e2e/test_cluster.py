"""Three Warren nodes and a real etcd on loopback, as one broker (issue 54)."""

from __future__ import annotations

import socket
import ssl

import pika
import pytest

from ..support.cluster import Cluster, wait_for

pytestmark = [pytest.mark.run_once, pytest.mark.slow]


@pytest.fixture(scope="module", params=[1, 2], ids=["gateways1", "gateways2"])
def cluster(tmp_path_factory, request):
    """Three nodes, each with one gateway process, then each with two (whose
    links to the other nodes are their own)."""
    with Cluster(tmp_path_factory.mktemp("cluster"), gateways=request.param) as running:
        yield running
    for node in running.nodes:
        assert "Traceback" not in node.log_text(), node.log_text()


def connect(node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url))


def test_every_node_lists_every_node_running(cluster):
    for node in cluster.nodes:
        listed = node.api("nodes")
        assert sorted(n["name"] for n in listed) == ["n1", "n2", "n3"]
        assert all(n["running"] for n in listed)


def test_a_message_published_through_one_node_is_consumed_through_another(cluster):
    one, two = connect(cluster.nodes[0]), connect(cluster.nodes[1])
    publisher, consumer = one.channel(), two.channel()
    names = [f"spread-{i}" for i in range(6)]
    for name in names:
        publisher.queue_declare(name, durable=True)
    homes = {q["name"]: q["node"] for q in cluster.nodes[2].api("queues") if q["name"] in names}
    assert set(homes.values()) == {"n1", "n2", "n3"}  # balanced: every node has some
    publisher.confirm_delivery()
    for name in names:
        publisher.basic_publish("", name, name.encode(), pika.BasicProperties(delivery_mode=2))
    got = []
    consumer.basic_qos(prefetch_count=10)
    for name in names:
        consumer.basic_consume(name, lambda ch, m, p, body: (got.append(body),
                                                             ch.basic_ack(m.delivery_tag)))
    wait_for(lambda: two.process_data_events(0.05) or len(got) == len(names), 10,
             "every message consumed")
    assert sorted(got) == sorted(n.encode() for n in names)
    one.close()
    two.close()


def test_streams_on_every_node_are_read_from_an_offset_through_another(cluster):
    one, two = connect(cluster.nodes[0]), connect(cluster.nodes[1])
    publisher, consumer = one.channel(), two.channel()
    names = [f"log-{i}" for i in range(6)]
    for name in names:
        publisher.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    homes = {q["name"]: q["node"] for q in cluster.nodes[2].api("queues") if q["name"] in names}
    assert set(homes.values()) == {"n1", "n2", "n3"}
    publisher.confirm_delivery()
    for name in names:
        for i in range(5):
            publisher.basic_publish("", name, b"%s-%d" % (name.encode(), i),
                                    pika.BasicProperties(delivery_mode=2))
    got: dict[str, list] = {name: [] for name in names}
    consumer.basic_qos(prefetch_count=10)
    for name in names:  # from offset 2: the third record on
        consumer.basic_consume(
            name, lambda ch, m, p, body, name=name: (
                got[name].append((p.headers["x-stream-offset"], body)),
                ch.basic_ack(m.delivery_tag)),
            arguments={"x-stream-offset": 2})
    wait_for(lambda: two.process_data_events(0.05) or all(len(v) == 3 for v in got.values()),
             10, "every stream read from offset 2")
    for name in names:
        assert got[name] == [(i, b"%s-%d" % (name.encode(), i)) for i in range(2, 5)]
    one.close()
    two.close()


def test_the_link_between_nodes_is_tls_where_the_nodes_have_a_certificate(tmp_path, certificate):
    cert, key = certificate
    tls = ["--tls-certfile", str(cert), "--tls-keyfile", str(key), "--tls-port", "0"]
    with Cluster(tmp_path, size=2, extra=tls) as running:
        one, two = running.nodes
        # The link's port speaks TLS (the shared secret is proven inside it) ...
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", two.link_port), timeout=5) as raw, \
                context.wrap_socket(raw) as wrapped:
            assert wrapped.version() is not None
        # ... and carries the nodes' traffic.
        with connect(one) as publisher_connection, connect(two) as consumer_connection:
            publisher = publisher_connection.channel()
            publisher.queue_declare("over-tls", arguments={"x-queue-leader-locator": "client-local"})
            publisher.confirm_delivery()
            publisher.basic_publish("", "over-tls", b"sealed")
            got = wait_for(lambda: consumer_connection.channel().basic_get("over-tls",
                                                                           auto_ack=True)[2],
                           10, "the message through the other node")
            assert got == b"sealed"
    for node in running.nodes:
        assert "Traceback" not in node.log_text(), node.log_text()


def test_a_queue_declared_through_one_node_is_there_at_once_through_the_others(cluster):
    """declare-ok is sent once every running node has the queue: the very next
    command, on a connection to another node already open, finds it."""
    connections = [connect(node) for node in cluster.nodes]
    channels = [c.channel() for c in connections]
    for i in range(30):
        name = f"at-once-{i}"
        channels[i % 3].queue_declare(name)
        for other in (channels[(i + 1) % 3], channels[(i + 2) % 3]):
            assert other.queue_declare(name, passive=True).method.queue == name
    for connection in connections:
        connection.close()
