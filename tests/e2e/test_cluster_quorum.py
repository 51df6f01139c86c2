"""Replicated quorum queues on a three-node cluster (issue 55): declared
through one node they have three members, any node serves them through their
leader, and killing the leader's node (kill -9) loses no confirmed message:
another member leads within seconds and the old one rejoins as a follower."""

from __future__ import annotations

import base64
import shutil

import pika
import pika.exceptions
import pytest

from warren.gateway.cluster import layout

from ..support.cluster import Cluster, connect, consume_until, wait_for

pytestmark = [pytest.mark.run_once, pytest.mark.slow]

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
COUNT = 500


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path, gateways=2) as running:
        yield running
    running.assert_no_traceback()


def publish(node, queue: str, bodies) -> None:
    """Persistent messages with confirms: every one of them confirmed (pika
    raises on a nack)."""
    connection = connect(node)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT, mandatory=True)
    finally:
        connection.close()


def shown(node, queue: str) -> dict:
    return node.api(f"queues/%2F/{queue}")


def group(cluster, queue: str) -> tuple[str | None, list[str]]:
    """The group's leader (None during an election) and in-sync members, as etcd
    holds them."""
    keys = layout.Layout("/test")  # the Cluster's nodes' prefix

    def value(key: bytes) -> bytes | None:
        kvs = cluster.etcd.call("/v3/kv/range", {"key": base64.b64encode(key).decode()})
        return base64.b64decode(kvs["kvs"][0]["value"]) if kvs.get("kvs") else None

    leader, in_sync = value(keys.group_leader("/", queue)), value(keys.group_isr("/", queue))
    return (None if leader is None else layout.decode_leader(leader).node,
            [] if in_sync is None else layout.decode_in_sync(in_sync).nodes)


def test_replicated_queue_survives_its_leaders_nodes(cluster):
    n1, n2, n3 = cluster.nodes
    connection = connect(n1)
    connection.channel().queue_declare("rq", durable=True, arguments=QUORUM)
    connection.close()
    leader, in_sync = wait_for(lambda: (found := group(cluster, "rq"))[0] and found, 10,
                               "a leader")
    assert sorted(in_sync) == ["n1", "n2", "n3"]
    for node in cluster.nodes:
        wait_for(lambda node=node: shown(node, "rq")["leader"] == leader, 10,
                 f"{node.name} shows the leader")
        info = shown(node, "rq")
        assert info["type"] == "quorum"
        assert sorted(info["members"]) == ["n1", "n2", "n3"]
        assert sorted(info["online"]) == ["n1", "n2", "n3"]
        assert info["node"] == leader

    by_name = {node.name: node for node in cluster.nodes}
    other = next(node for node in cluster.nodes if node.name != leader)
    first = {f"m{i}".encode() for i in range(COUNT)}
    publish(other, "rq", sorted(first))

    # The leader's node dies: another member leads, with every confirmed message;
    # a consumer through another node is cancelled (consumer_cancel_notify) and
    # may consume again once the new leader serves.
    survivors = [node for node in cluster.nodes if node.name != leader]
    watcher = connect(survivors[-1])
    watching = watcher.channel()
    watching.basic_qos(prefetch_count=1)
    cancelled: list = []
    watching.add_on_cancel_callback(cancelled.append)
    watching.basic_consume("rq", lambda *delivery: None)
    by_name[leader].kill()
    during = connect(survivors[0])
    channel = during.channel()
    channel.confirm_delivery()
    try:  # (not mandatory: a publish dropped as unroutable would be acked silently)
        channel.basic_publish("", "rq", b"during", PERSISTENT)
        first.add(b"during")  # acked: by a new leader already, so it must come back
    except pika.exceptions.NackError:
        pass
    during.close()
    wait_for(lambda: watcher.process_data_events(0) or cancelled, 15, "the consumer cancelled")
    second, _ = wait_for(lambda: (found := group(cluster, "rq"))[0] not in (None, leader)
                         and found, 15, "a new leader")
    assert second in {node.name for node in survivors}
    through = survivors[0]
    wait_for(lambda: shown(through, "rq")["leader"] == second, 10, "the route moved")
    publish(through, "rq", [b"after"])
    watching.basic_consume("rq", lambda *delivery: None)
    watcher.close()  # (its unacked delivery back in the queue)
    assert first | {b"after"} <= consume_until(through, "rq", first | {b"after"})

    # The old leader comes back as a follower; then the new leader's node dies too.
    more = {f"k{i}".encode() for i in range(100)}
    publish(through, "rq", sorted(more))
    by_name[leader].start()
    wait_for(lambda: sorted(shown(through, "rq")["online"]) == ["n1", "n2", "n3"], 20,
             "the old leader online again")
    wait_for(lambda: sorted(group(cluster, "rq")[1]) == ["n1", "n2", "n3"], 20,
             "the old leader in sync again")
    assert group(cluster, "rq")[0] == second
    by_name[second].kill()
    last = next(node for node in cluster.nodes if node.name != second)
    third = wait_for(lambda: group(cluster, "rq")[0] not in (None, second)
                     and group(cluster, "rq")[0], 15, "a third leader")
    wait_for(lambda: shown(last, "rq")["leader"] == third, 10,
             "the route moved again")
    assert more <= consume_until(last, "rq", more)

    # Deleted through the running node that does not lead: its group's keys go too.
    follower = next(node for node in cluster.nodes if node.name not in (second, third))
    connection = connect(follower)
    connection.channel().queue_delete("rq")
    connection.close()
    wait_for(lambda: group(cluster, "rq") == (None, []), 10, "the group's keys deleted")
    for node in (follower, by_name[third]):
        assert all(q["name"] != "rq" for q in node.api("queues"))


def test_a_wiped_node_gives_a_new_queue_a_new_id(cluster):
    """A data directory wiped counts queue ids afresh; a quorum queue declared
    through the node afterwards took its first queue's id, and with it that
    queue's group: answered, but never in etcd nor on the other nodes."""
    n1, n2, _ = cluster.nodes
    for name in ("first", "second"):
        if name == "second":
            n1.kill()
            shutil.rmtree(n1.data_dir)
            n1.start()
            wait_for(lambda: all(n["running"] for n in n2.api("nodes")), 30, "n1 back")
        conn = connect(n1)
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        wait_for(lambda: name in {q["name"] for q in n2.api("queues")}, 10, f"{name} on n2")
        wait_for(lambda: cluster.group(name).leader, 15, f"a leader of {name}")
