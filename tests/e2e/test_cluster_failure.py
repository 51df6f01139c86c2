"""A cluster losing a node or etcd (issue 54): the others keep serving, a queue
whose home node is down answers as RabbitMQ 3.10.8 answers for a classic queue
whose node is down, and what was durable is back once the node restarts on its
data. Each test kills something, so each has a cluster of its own."""

from __future__ import annotations

import time
import urllib.error

import pika
import pika.exceptions
import pytest

from ..support.cluster import Cluster, wait_for

pytestmark = [pytest.mark.run_once, pytest.mark.slow]

LOCAL = {"x-queue-leader-locator": "client-local"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
LEASE_TTL = 2  # the Cluster helper's
NOTICED = LEASE_TTL + 3  # seconds within which the others see a killed node down


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as running:
        yield running
    for node in running.nodes:
        assert "Traceback" not in node.log_text(), node.log_text()


def connect(node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1))


def refused(connection, operation) -> tuple[int, str]:
    """The code and text a fresh channel is closed with by `operation(channel)`."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        operation(connection.channel())
    return raised.value.reply_code, raised.value.reply_text


def count_on(connection, queue: str) -> int:
    ch = connection.channel()
    count = ch.queue_declare(queue, passive=True).method.message_count
    ch.close()
    return count


def homes(node) -> dict[str, tuple[str, str | None]]:
    """Queue name -> (its node, its state), as `node`'s /api/queues has them."""
    return {q["name"]: (q["node"], q.get("state")) for q in node.api("queues")}


def down_on(node, name: str) -> bool:
    return not any(n["running"] for n in node.api("nodes") if n["name"] == name)


def round_trip(publisher, consumer, queue: str) -> None:
    """A confirmed message published through one connection comes back through
    the other."""
    ch = publisher.channel()
    ch.confirm_delivery()
    body = f"through {queue}".encode()
    ch.basic_publish("", queue, body)
    ch.close()
    getter = consumer.channel()
    got = wait_for(lambda: getter.basic_get(queue, auto_ack=True)[2], 10, f"a message on {queue}")
    assert got == body
    getter.close()


def home_down(queue: str, node: str = "n3") -> tuple[int, str]:
    return (404, f"NOT_FOUND - home node '{node}' of durable queue '{queue}' in vhost '/' is "
                 "down or inaccessible")


def test_a_killed_node_is_down_within_its_lease_and_its_durable_queue_returns_with_it(
        cluster):
    n1, n2, n3 = cluster.nodes
    with connect(n3) as on_n3:
        ch = on_n3.channel()
        ch.confirm_delivery()
        ch.queue_declare("dq3", durable=True, arguments=LOCAL)
        ch.queue_bind("dq3", "amq.direct", "dq3-key")
        ch.queue_declare("tq3", arguments=LOCAL)
        for i in range(5):
            ch.basic_publish("", "dq3", f"kept {i}".encode(), PERSISTENT)
        ch.basic_publish("", "dq3", b"transient")
    with connect(n1) as c1:
        c1.channel().queue_declare("q1", arguments=LOCAL)
    with connect(n2) as c2:
        c2.channel().queue_declare("q2", arguments=LOCAL)
    assert {name: home for name, (home, _) in homes(n1).items()} == \
        {"dq3": "n3", "tq3": "n3", "q1": "n1", "q2": "n2"}

    consumer = connect(n1)
    cancels, held = [], []
    ch = consumer.channel()
    ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method.consumer_tag))
    ch.basic_qos(prefetch_count=1)
    durable_tag = ch.basic_consume("dq3", lambda c, m, p, body: held.append(body))
    transient_tag = ch.basic_consume("tq3", lambda *a: None, auto_ack=True)
    wait_for(lambda: consumer.process_data_events(0.02) or held, 10, "one delivery held")

    killed = time.monotonic()
    n3.kill()
    wait_for(lambda: down_on(n1, "n3") and down_on(n2, "n3"), NOTICED + 5, "n3 seen down")
    assert time.monotonic() - killed < NOTICED
    assert {n["name"]: n["running"] for n in n1.api("nodes")} == \
        {"n1": True, "n2": True, "n3": False}
    wait_for(lambda: consumer.process_data_events(0.02) or len(cancels) == 2, 10,
             "both consumers of n3's queues cancelled")
    assert sorted(cancels) == sorted([durable_tag, transient_tag])
    assert ch.is_open and held == [b"kept 0"]

    # the others go on serving their own queues, through either node
    with connect(n1) as c1, connect(n2) as c2:
        round_trip(c1, c2, "q1")
        round_trip(c2, c1, "q2")
    for node in (n1, n2):  # the transient queue died with its node; the durable is down
        wait_for(lambda node=node: "tq3" not in homes(node), 10, f"tq3 gone on {node.name}")
        assert homes(node)["dq3"] == ("n3", "down")
    consumer.close()

    n3.start()
    wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30,
             "n3 back and seen by every node")
    with connect(n1) as c1:  # listed running: its queues answer through the others
        assert count_on(c1, "dq3") == 5
        getter = c1.channel()
        got = [getter.basic_get("dq3", auto_ack=True)[:3:2] for _ in range(5)]
        assert [body for _, body in got] == [f"kept {i}".encode() for i in range(5)]
        assert got[0][0].redelivered  # it had been delivered before the crash
        publisher = c1.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("amq.direct", "dq3-key", b"bound still", mandatory=True)
        assert getter.basic_get("dq3", auto_ack=True)[2] == b"bound still"
    assert n2.api("queues/%2F/dq3")["node"] == "n3"


def test_a_queue_whose_home_node_is_down_answers_as_rabbitmq(cluster):
    """Every command on it closes the channel with 404 (another declaration too,
    not 406); a publish to it is dropped, acked in confirm mode, returned
    NO_ROUTE when mandatory; a transient queue of that node is gone, and its name
    free again."""
    n1, n2, n3 = cluster.nodes
    with connect(n3) as on_n3:
        ch = on_n3.channel()
        ch.confirm_delivery()
        ch.queue_declare("dq3", durable=True, arguments=LOCAL)
        ch.queue_bind("dq3", "amq.direct", "dq3-key")
        ch.queue_declare("dq3-args", durable=True, arguments={**LOCAL, "x-max-length": 10})
        ch.queue_declare("tq3", arguments=LOCAL)
        ch.basic_publish("", "dq3", b"before", PERSISTENT)
    n3.kill()
    wait_for(lambda: down_on(n1, "n3"), NOTICED + 5, "n3 seen down")
    wait_for(lambda: "tq3" not in homes(n1), 10, "tq3 gone")

    with connect(n1) as c1:
        for queue, operation in [
                ("dq3", lambda ch: ch.queue_declare("dq3", durable=True, arguments=LOCAL)),
                ("dq3", lambda ch: ch.queue_declare("dq3", passive=True)),
                ("dq3", lambda ch: ch.queue_declare("dq3", durable=False)),
                ("dq3-args", lambda ch: ch.queue_declare("dq3-args", durable=True,
                                                         arguments={"x-max-length": 11})),
                ("dq3", lambda ch: ch.basic_consume("dq3", lambda *a: None)),
                ("dq3", lambda ch: ch.basic_get("dq3")),
                ("dq3", lambda ch: ch.queue_purge("dq3")),
                ("dq3", lambda ch: ch.queue_bind("dq3", "amq.fanout")),
                ("dq3", lambda ch: ch.queue_unbind("dq3", "amq.direct", "dq3-key")),
                ("dq3-args", lambda ch: ch.queue_delete("dq3-args"))]:
            assert refused(c1, operation) == home_down(queue)
        returns = []
        quiet = c1.channel()
        quiet.add_on_return_callback(lambda ch, method, props, body: returns.append(
            (method.reply_code, method.reply_text, body)))
        quiet.basic_publish("", "dq3", b"dropped", PERSISTENT)
        quiet.basic_publish("amq.direct", "dq3-key", b"returned", PERSISTENT, mandatory=True)
        wait_for(lambda: c1.process_data_events(0.02) or returns, 10, "the mandatory return")
        assert returns == [(312, "NO_ROUTE", b"returned")]
        assert quiet.is_open
        confirming = c1.channel()
        confirming.confirm_delivery()
        confirming.basic_publish("", "dq3", b"acked, lost", PERSISTENT)  # NackError if nacked
        with pytest.raises(pika.exceptions.UnroutableError):
            confirming.basic_publish("", "dq3", b"returned", PERSISTENT, mandatory=True)

        fresh = c1.channel()
        assert fresh.queue_declare("tq3").method.message_count == 0
    assert homes(n2)["tq3"][0] in ("n1", "n2")
    assert homes(n1)["dq3"] == ("n3", "down")
    with pytest.raises(urllib.error.HTTPError) as raised:  # listed, yet not found by name
        n1.api("queues/%2F/dq3")
    assert raised.value.code == 404

    n3.start()
    wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30,
             "n3 back and seen by every node")
    with connect(n2) as c2:
        wait_for(lambda: count_on(c2, "dq3") == 1, 10, "dq3 back")
        assert c2.channel().basic_get("dq3", auto_ack=True)[2] == b"before"
        c2.channel().queue_declare("dq3-args", passive=True)  # not deleted
    assert n1.api("queues/%2F/dq3-args")["arguments"] == {**LOCAL, "x-max-length": 10}


def test_a_clean_stop_and_restart_keeps_every_queue_and_message(cluster):
    n1, n2, n3 = cluster.nodes
    names = [f"kept-{i}" for i in range(6)]
    with connect(n1) as c1:
        ch = c1.channel()
        ch.confirm_delivery()
        for name in names:
            ch.queue_declare(name, durable=True)
            for i in range(3):
                ch.basic_publish("", name, f"{name}/{i}".encode(), PERSISTENT)
    assert "n2" in {home for home, _ in homes(n1).values()}
    n2.stop()
    # a clean stop leaves at once: no lease to wait out
    wait_for(lambda: down_on(n1, "n2") and down_on(n3, "n2"), LEASE_TTL, "n2 seen leaving")
    n2.start()
    wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30,
             "n2 back and seen by every node")
    for node in cluster.nodes:  # listed running: its queues answer through every node
        with connect(node) as connection:
            assert {name: count_on(connection, name) for name in names} == \
                {name: 3 for name in names}, node.name
    with connect(n3) as c3:
        getter = c3.channel()
        for name in names:
            assert [getter.basic_get(name, auto_ack=True)[2] for _ in range(3)] == \
                [f"{name}/{i}".encode() for i in range(3)]


def test_without_etcd_nodes_serve_what_they_have_refuse_changes_and_catch_up(cluster):
    n1, n2, n3 = cluster.nodes
    queues = {node.name: f"on-{node.name}" for node in cluster.nodes}
    for node in cluster.nodes:
        with connect(node) as connection:
            connection.channel().queue_declare(queues[node.name], durable=True,
                                               arguments=LOCAL)

    cluster.etcd.stop()
    connections = [connect(node) for node in cluster.nodes]  # new clients are served too
    try:
        for i, publisher in enumerate(connections):
            consumer = connections[(i + 1) % 3]
            for queue in queues.values():
                round_trip(publisher, consumer, queue)

        doomed = connect(n1)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            doomed.channel().queue_declare("while-etcd-is-down", durable=True)
        assert raised.value.reply_code == 541
        assert raised.value.reply_text == (
            "INTERNAL_ERROR - Could not declare queue 'while-etcd-is-down' in vhost '/' on "
            "node 'n1' because the metadata store operation timed out")
        # the management API's changes are refused too, not kept on one node
        with pytest.raises(urllib.error.HTTPError):
            n2.api("vhosts/while-etcd-is-down", "PUT", {})
        with pytest.raises(urllib.error.HTTPError):
            n3.api("queues/%2F/while-etcd-is-down", "PUT", {"durable": True})
        for node in cluster.nodes:
            assert "while-etcd-is-down" not in homes(node), node.name
            assert "while-etcd-is-down" not in {v["name"] for v in node.api("vhosts")}, \
                node.name
        for i, publisher in enumerate(connections):  # the others' connections go on
            round_trip(publisher, connections[(i + 2) % 3], queues["n3"])
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()

    cluster.etcd.start()
    wait_for(lambda: all(len(n.running_nodes()) == 3 for n in cluster.nodes), 30,
             "every node registered again")

    def declared() -> bool:
        with connect(n2) as connection:
            connection.channel().queue_declare("after-etcd", durable=True)
        return True

    wait_for(declared, 15, "a declaration through n2 once etcd is back")
    for node in (n1, n3):
        with connect(node) as connection:
            assert connection.channel().queue_declare(
                "after-etcd", passive=True).method.queue == "after-etcd"
    with connect(n3) as c3, connect(n1) as c1:
        round_trip(c3, c1, "after-etcd")
