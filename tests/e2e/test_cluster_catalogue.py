"""Three nodes as one broker (issue 54): what one node changes holds at once
through the others, and a queue on one node behaves, through any other, as it
does on a node alone. The answers are RabbitMQ 3.10.8's on a three-node cluster."""

from __future__ import annotations

import base64
import itertools
import threading
import urllib.error
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from warren.gateway.cluster import layout as lay

from ..support.cluster import Cluster, wait_for

pytestmark = [pytest.mark.run_once, pytest.mark.slow]

LOCAL = {"x-queue-leader-locator": "client-local"}
_names = itertools.count(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # No node dies here: a long lease keeps a slow etcd on a busy machine from
    # dropping one (and its catalogue changes refused until it registers again).
    with Cluster(tmp_path_factory.mktemp("cluster"), lease_ttl=10) as running:
        yield running
    for node in running.nodes:
        assert "Traceback" not in node.log_text(), node.log_text()


@pytest.fixture(autouse=True)
def no_queue_left(cluster):
    """Each test starts on a cluster without queues, so that placement by
    balance is foreseeable whatever ran before."""
    yield
    for queue in cluster.nodes[0].api("queues"):
        try:
            cluster.nodes[0].api(f"queues/{quote(queue['vhost'], safe='')}/"
                                 f"{quote(queue['name'], safe='')}", "DELETE")
        except urllib.error.HTTPError:
            pass  # an exclusive queue: it goes with its connection
    wait_for(lambda: not any(node.api("queues") for node in cluster.nodes), 10,
             "every queue deleted on every node")


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def connect(node, vhost: str = "/", user: str = "guest",
            password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password),
        connection_attempts=1))


def refused(connection, operation) -> tuple[int, str]:
    """The code and text a fresh channel is closed with by `operation(channel)`."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        operation(connection.channel())
    return raised.value.reply_code, raised.value.reply_text


def homes(node) -> dict[str, str]:
    """Queue name -> its node, as `node`'s /api/queues has it."""
    return {q["name"]: q["node"] for q in node.api("queues")}


def count_on(connection, queue: str) -> int:
    ch = connection.channel()
    count = ch.queue_declare(queue, passive=True).method.message_count
    ch.close()
    return count


def got_one(ch, queue: str):
    """(method, properties, body) of a message taken from `queue`, or None."""
    got = ch.basic_get(queue, auto_ack=True)
    return got if got[0] is not None else None


def declare_on(node, queue: str, **kwargs) -> None:
    """A queue declared through `node` and homed there."""
    with connect(node) as connection:
        connection.channel().queue_declare(queue, arguments={**LOCAL, **kwargs.pop(
            "arguments", {})}, **kwargs)
    assert homes(node)[queue] == node.name


# -- the catalogue ------------------------------------------------------------------


def test_exchange_queue_and_binding_made_through_one_node_hold_at_once_through_the_others(
        cluster):
    n1, n2, n3 = cluster.nodes
    x, q = unique("cat-x"), unique("cat-q")
    with connect(n1) as c1, connect(n2) as c2, connect(n3) as c3:
        ch1 = c1.channel()
        ch1.exchange_declare(x, "direct", durable=True)
        ch1.queue_declare(q, durable=True)
        ch1.queue_bind(q, x, "k")
        c2.channel().exchange_declare(x, passive=True)
        c3.channel().queue_declare(q, passive=True)
        ch3 = c3.channel()
        ch3.confirm_delivery()
        ch3.basic_publish(x, "k", b"routed", mandatory=True)  # UnroutableError if unbound
        assert count_on(c2, q) == 1
        for node in cluster.nodes:
            assert any(b["source"] == x and b["destination"] == q and b["routing_key"] == "k"
                       for b in node.api("bindings/%2F")), node.name

        c2.channel().queue_unbind(q, x, "k")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch3.basic_publish(x, "k", b"unbound", mandatory=True)
        c3.channel().queue_delete(q)
        assert refused(c1, lambda ch: ch.queue_declare(q, passive=True)) == \
            (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")
        c2.channel().exchange_delete(x)
        assert refused(c1, lambda ch: ch.exchange_declare(x, passive=True)) == \
            (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")
        for node in cluster.nodes:
            assert x not in {e["name"] for e in node.api("exchanges/%2F")}, node.name


def test_a_binding_made_or_removed_through_one_node_routes_so_at_once_through_another(
        cluster):
    """bind-ok and unbind-ok mean every node routes so: the next publish through
    another node, right after, finds the binding, and then finds it gone."""
    n2, n3 = cluster.nodes[1:]
    q = unique("bound-q")
    with connect(n2) as binder, connect(n3) as publisher:
        binding = binder.channel()
        binding.queue_declare(q)
        ch = publisher.channel()
        ch.confirm_delivery()
        for i in range(20):
            binding.queue_bind(q, "amq.direct", f"key-{i}")
            ch.basic_publish("amq.direct", f"key-{i}", b"routed", mandatory=True)
            binding.queue_unbind(q, "amq.direct", f"key-{i}")
            with pytest.raises(pika.exceptions.UnroutableError):
                ch.basic_publish("amq.direct", f"key-{i}", b"unbound", mandatory=True)
        assert count_on(binder, q) == 20


def test_vhost_user_and_permission_made_through_one_node_hold_at_once_through_the_others(
        cluster):
    n1, n2, n3 = cluster.nodes
    vhost, user = unique("cat-vhost"), unique("cat-user")
    n1.api(f"vhosts/{vhost}", "PUT", {})
    n1.api(f"users/{user}", "PUT", {"password": "secret-pw", "tags": ""})
    n2.api(f"permissions/{vhost}/{user}", "PUT",
           {"configure": ".*", "write": ".*", "read": ".*"})
    with connect(n3, vhost, user, "secret-pw") as connection:
        ch = connection.channel()
        ch.queue_declare("in-vhost")
        ch.queue_delete("in-vhost")
    for node in cluster.nodes:
        assert vhost in {v["name"] for v in node.api("vhosts")}, node.name
        assert user in {u["name"] for u in node.api("users")}, node.name
        assert {(p["user"], p["vhost"]) for p in node.api(f"users/{user}/permissions")} == \
            {(user, vhost)}, node.name

    n3.api(f"permissions/{vhost}/{user}", "DELETE")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
        connect(n1, vhost, user, "secret-pw")
    assert f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'" in \
        str(raised.value)
    n2.api(f"users/{user}", "DELETE")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(n1, vhost, user, "secret-pw")
    n3.api(f"vhosts/{vhost}", "DELETE")
    for node in cluster.nodes:
        assert vhost not in {v["name"] for v in node.api("vhosts")}, node.name
        assert user not in {u["name"] for u in node.api("users")}, node.name


def test_a_policy_set_through_one_node_applies_to_a_queue_on_another(cluster):
    n1, n2, n3 = cluster.nodes
    q = unique("pol-q")
    n2.api(f"policies/%2F/{q}-limit", "PUT",
           {"pattern": f"^{q}$", "definition": {"max-length": 2}, "apply-to": "queues"})
    declare_on(n3, q)
    assert n1.api(f"queues/%2F/{q}")["effective_policy_definition"] == {"max-length": 2}
    with connect(n1) as c1:
        ch = c1.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", q, f"m{i}".encode())
        assert count_on(c1, q) == 2  # the oldest dropped from the head
        assert ch.basic_get(q, auto_ack=True)[2] == b"m3"

        n1.api(f"policies/%2F/{q}-limit", "DELETE")
        for node in cluster.nodes:
            assert node.api(f"queues/%2F/{q}")["effective_policy_definition"] == {}, node.name
        for i in range(5):
            ch.basic_publish("", q, f"n{i}".encode())
        assert count_on(c1, q) == 6


def test_a_policy_set_while_another_node_declares_its_queue_applies_to_that_queue(cluster):
    """Whichever of the two etcd takes first, the queue's own shard ends up with
    the policy."""
    n1, n2, n3 = cluster.nodes
    with connect(n3) as declarer, connect(n1) as publisher:
        ch = publisher.channel()
        ch.confirm_delivery()
        for _ in range(4):
            q = unique("pol-race")
            barrier = threading.Barrier(2, timeout=10)

            def set_policy(q=q, barrier=barrier) -> None:
                barrier.wait()
                n2.api(f"policies/%2F/{q}", "PUT", {"pattern": f"^{q}$", "apply-to": "queues",
                                                    "definition": {"max-length": 2}})

            setter = threading.Thread(target=set_policy)
            setter.start()
            declaring = declarer.channel()
            barrier.wait()
            declaring.queue_declare(q, arguments=LOCAL)
            setter.join(10)
            wait_for(lambda q=q: all(node.api(f"queues/%2F/{q}")["effective_policy_definition"]
                                     for node in cluster.nodes), 10, "the policy everywhere")
            for i in range(5):
                ch.basic_publish("", q, f"m{i}".encode())
            assert count_on(publisher, q) == 2, q
            n2.api(f"policies/%2F/{q}", "DELETE")


def test_every_node_names_each_queues_node_and_default_placement_spreads(cluster):
    """Balanced (Warren's default): each new queue on a node with the fewest, so
    six queues on an empty cluster are two on each node."""
    names = [unique("spread") for _ in range(6)]
    with connect(cluster.nodes[0]) as connection:
        ch = connection.channel()
        for name in names:
            ch.queue_declare(name, durable=True)
    seen = [homes(node) for node in cluster.nodes]
    assert seen[0] == seen[1] == seen[2]
    placed = [seen[0][name] for name in names]
    assert sorted(placed) == ["n1", "n1", "n2", "n2", "n3", "n3"]


def test_the_leader_locator_argument_places_a_queue(cluster):
    n1, n2, n3 = cluster.nodes
    for node in (n2, n3):
        with connect(node) as connection:
            ch = connection.channel()
            local = [unique(f"local-{node.name}") for _ in range(3)]
            for name in local:
                ch.queue_declare(name, arguments=LOCAL)
        where = homes(n1)
        assert [where[name] for name in local] == [node.name] * 3
    with connect(n1) as connection:
        ch = connection.channel()
        for _ in range(6):
            counts = {node.name: 0 for node in cluster.nodes}
            for home in homes(n1).values():
                counts[home] += 1
            name = unique("balanced")
            ch.queue_declare(name, arguments={"x-queue-leader-locator": "balanced"})
            assert counts[homes(n1)[name]] == min(counts.values()), (name, counts)
    counts = {node.name: 0 for node in cluster.nodes}
    for home in homes(n1).values():
        counts[home] += 1
    assert counts == {"n1": 4, "n2": 4, "n3": 4}


# -- exclusive queues -----------------------------------------------------------------


def locked(queue: str) -> tuple[int, str]:
    return (405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' "
                 "in vhost '/'. It could be originally declared on another connection or the "
                 "exclusive property value does not match that of the original declaration.")


def test_an_exclusive_queue_lives_on_its_connections_node(cluster):
    """As in RabbitMQ, whatever the locator: it lives and dies with its connection."""
    n1, n2 = cluster.nodes[:2]
    names = [unique("excl-home") for _ in range(3)]
    with connect(n1) as owner:
        ch = owner.channel()
        for name in names:
            ch.queue_declare(name, exclusive=True,
                             arguments={"x-queue-leader-locator": "balanced"})
        where = homes(n2)
        assert [where[name] for name in names] == ["n1"] * 3
        listed = n2.api(f"queues/%2F/{names[0]}")
        assert (listed["node"], listed["exclusive"]) == ("n1", True)


def test_an_exclusive_queue_of_a_connection_on_one_node_is_locked_on_the_others(cluster):
    n1, n2 = cluster.nodes[:2]
    q = unique("excl-q")
    with connect(n1) as owner, connect(n2) as other, connect(n1) as neighbour:
        mine = owner.channel()
        mine.queue_declare(q, exclusive=True)
        for operation in (lambda ch: ch.queue_declare(q, exclusive=True),
                          lambda ch: ch.queue_declare(q),
                          lambda ch: ch.queue_declare(q, passive=True),
                          lambda ch: ch.basic_consume(q, lambda *a: None),
                          lambda ch: ch.basic_get(q),
                          lambda ch: ch.queue_delete(q),
                          lambda ch: ch.queue_purge(q),
                          lambda ch: ch.queue_bind(q, "amq.fanout")):
            assert refused(other, operation) == locked(q)
        # the rule is per connection: another one on the owner's node is refused too
        assert refused(neighbour, lambda ch: ch.queue_declare(q, passive=True)) == locked(q)
        other.channel().queue_unbind(q, "amq.direct", "never-bound")  # no check: unbind-ok
        publisher = other.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", q, b"to the owner", mandatory=True)  # allowed, routed
        assert mine.basic_get(q, auto_ack=True)[2] == b"to the owner"
    for node in cluster.nodes:  # gone with its connection
        wait_for(lambda node=node: q not in homes(node), 10, f"{q} gone on {node.name}")


def test_two_nodes_declaring_one_queue_with_other_arguments_at_once_make_one_queue(cluster):
    """One declare-ok and one 406 every time: etcd's transaction decides, and holds
    one queue, the winner's."""
    n1, n2 = cluster.nodes[:2]
    connections = [connect(n1), connect(n2)]
    try:
        for _ in range(12):
            q = unique("race")
            barrier = threading.Barrier(2, timeout=10)
            outcomes: list = [None, None]

            def declare(i: int) -> None:
                ch = connections[i].channel()
                barrier.wait()
                try:
                    ch.queue_declare(q, durable=True, arguments={"x-max-length": 10 + i})
                    outcomes[i] = "ok"
                    ch.close()
                except pika.exceptions.ChannelClosedByBroker as error:
                    outcomes[i] = (error.reply_code, error.reply_text)

            threads = [threading.Thread(target=declare, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20)
            assert outcomes.count("ok") == 1, outcomes
            winner = outcomes.index("ok")
            code, text = outcomes[1 - winner]
            assert code == 406 and text.startswith(
                f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' "
                "in vhost '/'"), text
            key = lay.Layout("/test").queue_key("/", q)
            kvs = cluster.etcd.call("/v3/kv/range", {
                "key": base64.b64encode(key).decode()}).get("kvs", [])
            assert len(kvs) == 1
            record = lay.decode(base64.b64decode(kvs[0]["value"]))
            assert record.definition.spec.arguments == {"x-max-length": 10 + winner}
            for node in cluster.nodes:
                assert node.api(f"queues/%2F/{q}")["arguments"] == \
                    {"x-max-length": 10 + winner}, node.name
    finally:
        for connection in connections:
            connection.close()


# -- a queue on another node, through this one ---------------------------------------


def test_direct_reply_to_across_nodes(cluster):
    n1, n2 = cluster.nodes[:2]
    rpc = unique("rpc")
    declare_on(n2, rpc)
    replies = []
    with connect(n1) as requester, connect(n2) as replier:
        asking = requester.channel()
        asking.basic_consume("amq.rabbitmq.reply-to",
                             lambda ch, m, props, body: replies.append(
                                 (props.correlation_id, body)), auto_ack=True)
        answering = replier.channel()

        def answer(ch, method, props, body) -> None:
            ch.basic_publish("", props.reply_to, b"re: " + body,
                             pika.BasicProperties(correlation_id=props.correlation_id))
            ch.basic_ack(method.delivery_tag)

        answering.basic_consume(rpc, answer)
        for i in range(3):
            asking.basic_publish("", rpc, f"ask {i}".encode(), pika.BasicProperties(
                reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))
        wait_for(lambda: replier.process_data_events(0.02) or
                 requester.process_data_events(0.02) or len(replies) == 3, 10,
                 "three replies from the other node")
    assert sorted(replies) == [(str(i), f"re: ask {i}".encode()) for i in range(3)]


def test_dead_lettering_to_a_queue_on_another_node(cluster):
    n1, n2, n3 = cluster.nodes
    source, target = unique("dlx-src"), unique("dlx-dst")
    declare_on(n2, target)
    declare_on(n1, source, arguments={"x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": target})
    with connect(n3) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        ch.basic_publish("", source, b"rejected")
        method, _, _ = ch.basic_get(source)
        ch.basic_reject(method.delivery_tag, requeue=False)
        _, props, body = wait_for(lambda: got_one(ch, target), 10, "the dead letter")
    assert body == b"rejected"
    [death] = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (source, "rejected", 1)


def test_message_ttl_on_a_queue_on_another_node(cluster):
    """Messages expire on their queue's node, and are dead-lettered from there to
    a third node's queue."""
    n1, n2, n3 = cluster.nodes
    short, expired = unique("ttl"), unique("ttl-expired")
    declare_on(n3, expired)
    declare_on(n2, short, arguments={"x-message-ttl": 100, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": expired})
    with connect(n1) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", short, f"old {i}".encode())
        wait_for(lambda: count_on(connection, expired) == 3, 10, "three messages expired")
        assert count_on(connection, short) == 0
        _, props, body = ch.basic_get(expired, auto_ack=True)
    assert body == b"old 0" and props.headers["x-death"][0]["reason"] == "expired"


def test_priorities_on_a_queue_on_another_node(cluster):
    n1, n2, n3 = cluster.nodes
    q = unique("prio")
    declare_on(n2, q, arguments={"x-max-priority": 10})
    with connect(n1) as publisher, connect(n3) as consumer:
        ch = publisher.channel()
        ch.confirm_delivery()
        for priority in (3, 9, 1, 7, 5):
            ch.basic_publish("", q, str(priority).encode(),
                             pika.BasicProperties(priority=priority))
        getter = consumer.channel()
        bodies = [getter.basic_get(q, auto_ack=True)[2] for _ in range(5)]
    assert bodies == [b"9", b"7", b"5", b"3", b"1"]


def test_a_consumer_is_cancelled_when_its_queue_on_another_node_is_deleted(cluster):
    n1, n2, n3 = cluster.nodes
    q = unique("cancelled")
    declare_on(n2, q)
    cancels = []
    with connect(n1) as consumer, connect(n3) as deleter:
        ch = consumer.channel()
        ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method.consumer_tag))
        tag = ch.basic_consume(q, lambda *a: None)
        deleter.channel().queue_delete(q)
        wait_for(lambda: consumer.process_data_events(0.02) or cancels, 10,
                 "basic.cancel from the server")
        assert cancels == [tag]
        assert ch.is_open
        ch.queue_declare(unique("still-open"), arguments=LOCAL)  # the channel goes on


def test_prefetch_holds_a_consumer_on_another_node(cluster):
    n1, n2 = cluster.nodes[:2]
    q = unique("prefetch")
    declare_on(n1, q)
    got = []
    with connect(n1) as publisher, connect(n2) as consumer:
        ch = publisher.channel()
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", q, str(i).encode())
        taking = consumer.channel()
        taking.basic_qos(prefetch_count=5)
        taking.basic_consume(q, lambda c, method, p, b: got.append(method.delivery_tag))
        wait_for(lambda: consumer.process_data_events(0.02) or len(got) >= 5, 10,
                 "five deliveries")
        consumer.process_data_events(0.5)  # time for a sixth, which must not come
        assert len(got) == 5
        assert count_on(publisher, q) == 15
        taking.basic_ack(got[0])
        wait_for(lambda: consumer.process_data_events(0.02) or len(got) >= 6, 10,
                 "one more delivery for one ack")
        consumer.process_data_events(0.3)
        assert len(got) == 6


def test_publisher_confirms_across_nodes(cluster):
    """Acks once the other node's queue has the message, a nack when it refuses
    it (reject-publish), a return when nothing is bound."""
    n1, n2, n3 = cluster.nodes
    plenty, full = unique("confirm"), unique("confirm-full")
    declare_on(n3, plenty, durable=True)
    declare_on(n2, full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    with connect(n1) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish("", plenty, str(i).encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", full, b"first")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", full, b"refused")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.direct", unique("nothing-bound"), b"lost", mandatory=True)
    with connect(n2) as connection:
        assert count_on(connection, plenty) == 50
        assert count_on(connection, full) == 1


def test_a_consumer_on_another_node_times_out_and_its_message_goes_back(cluster):
    """The quorum queue's delivery acknowledgement timeout, with the consumer on
    another node: basic.cancel, and the message redelivered."""
    n1, n2, n3 = cluster.nodes
    q = unique("timeout-qq")
    declare_on(n1, q, durable=True, arguments={"x-queue-type": "quorum"})
    cancels, held = [], []
    with connect(n2) as consumer, connect(n3) as other:
        ch = consumer.channel()
        ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method.consumer_tag))
        tag = ch.basic_consume(q, lambda c, method, p, body: held.append(body),
                               arguments={"x-consumer-timeout": 300})
        publisher = other.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", q, b"held too long")
        wait_for(lambda: consumer.process_data_events(0.02) or cancels, 10,
                 "the consumer cancelled on its timeout")
        assert (cancels, held) == ([tag], [b"held too long"]) and ch.is_open
        method, _, body = wait_for(lambda: got_one(publisher, q), 10, "the message back")
    assert (body, method.redelivered) == (b"held too long", True)
