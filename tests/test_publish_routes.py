"""The routes a channel remembers (gateway/publishing.py, Route), in-process
(tests/inproc.py): a publish like an earlier one goes where the full routing
would send it now, whatever changed in between (bindings, queues, permissions,
the channel's mode, a resource alarm, the message's own properties)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.properties import BasicProperties, encode_properties
from warren.shards import records as r

QUEUES = 3
PROPERTIES = {  # the kinds of content header a publisher sends
    "none": b"\x00\x00",
    "persistent": encode_properties(BasicProperties(delivery_mode=2)),
    "typed": encode_properties(BasicProperties(content_type="text/plain", delivery_mode=2)),
    "expiring": encode_properties(BasicProperties(expiration="60000")),
    "cc": encode_properties(BasicProperties(headers={"CC": ["b"]})),
}
EXCHANGES = ["", "amq.direct", "amq.topic", "amq.fanout", "amq.headers"]
_examples = itertools.count()

publishes = st.tuples(st.just("publish"), st.sampled_from(EXCHANGES),
                      st.sampled_from(["a", "b", "q0", "q1", "nowhere"]),
                      st.sampled_from(sorted(PROPERTIES)), st.booleans())
bindings = st.tuples(st.sampled_from(["bind", "unbind"]), st.sampled_from(EXCHANGES[1:]),
                     st.integers(0, QUEUES - 1), st.sampled_from(["a", "b", "#"]))
queue_changes = st.tuples(st.just("redeclare"), st.integers(0, QUEUES - 1))


def _recording(link) -> list:
    """The publish records `link` is handed from now on."""
    sent = []
    send = link.send

    def recorded(record, feeder=None, lazy=False):
        if type(record) is r.Publish:
            sent.append(record)
        send(record, feeder, lazy)
    link.send = recorded
    return sent


def _connected(inproc, **handshake):
    client = inproc.client()
    client.handshake(**handshake)
    for channel in (1, 2):
        client.open_channel(channel)
    return client


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.one_of(publishes, publishes, bindings, queue_changes), min_size=1,
                max_size=25))
def test_a_remembered_route_sends_what_full_routing_sends(inproc, script):
    """Each publish goes out twice on channel 1 (the second time by the route it
    remembered) and once on channel 2, which forgets its routes first: the shard
    gets the same records each time, as bindings and queues change between them."""
    n = next(_examples)
    client = _connected(inproc)
    names = [f"routes{n}.q{i}" for i in range(QUEUES)]
    for name in names:
        client.call(1, m.QueueDeclare(queue=name, exclusive=True), m.QueueDeclareOk)
    link = inproc.gateway.shards.links[0]
    sent = _recording(link)
    remembering, forgetting = client.conn.channels[1], client.conn.channels[2]
    try:
        for step in script:
            if step[0] == "publish":
                _, exchange, key, kind, mandatory = step
                key = names[int(key[1])] if key in ("q0", "q1") else key
                outcomes = []
                for channel in (1, 1, 2):
                    if channel == 2:
                        forgetting._routes.clear()
                    client.publish(channel, key, b"m", exchange, mandatory, PROPERTIES[kind])
                    returned = [payload[:4] for kind_, _, payload in client.pending()
                                if kind_ == frames.FRAME_METHOD]  # basic.return's ids
                    outcomes.append((list(sent), returned))
                    sent.clear()
                assert outcomes[0] == outcomes[1] == outcomes[2], (step, outcomes)
            elif step[0] in ("bind", "unbind"):
                action, exchange, queue, key = step
                kind = m.QueueBind if action == "bind" else m.QueueUnbind
                client.call(1, kind(queue=names[queue], exchange=exchange, routing_key=key),
                            m.QueueBindOk if action == "bind" else m.QueueUnbindOk)
            else:
                name = names[step[1]]
                client.call(1, m.QueueDelete(queue=name), m.QueueDeleteOk)
                client.call(1, m.QueueDeclare(queue=name, exclusive=True), m.QueueDeclareOk)
        assert not remembering.closing and not forgetting.closing
    finally:
        del link.send


def _declared(client) -> str:
    """A new exclusive queue, by a name of the test's own (a server-named one could
    not be declared again)."""
    name = f"routes.q{next(_examples)}"
    client.call(1, m.QueueDeclare(queue=name, exclusive=True), m.QueueDeclareOk)
    return name


def _remembered(inproc, client, queue: str, properties: bytes = b"\x00\x00") -> None:
    """Publish to `queue` until channel 1 remembers the route."""
    channel = client.conn.channels[1]
    for _ in range(2):
        client.publish(1, queue, b"m", properties=properties)
    inproc.settle()
    assert channel._routes, "the channel remembered no route"


def _count(client, queue: str) -> int:
    return client.call(2, m.QueueDeclare(queue=queue, passive=True),
                       m.QueueDeclareOk).message_count


def test_a_remembered_route_is_refused_once_write_permission_is_gone(inproc):
    access = inproc.gateway.access
    access.put_user("router", "secret", [])
    access.set_permissions("router", "/", ".*", ".*", ".*")
    try:
        client = _connected(inproc, user="router", password="secret")
        queue = _declared(client)
        _remembered(inproc, client, queue)
        access.set_permissions("router", "/", ".*", "", ".*")
        client.publish(1, queue, b"refused")
        assert client.expect(1, m.ChannelClose) == m.ChannelClose(
            reply_code=403, reply_text="ACCESS_REFUSED - access to exchange 'amq.default' in "
            "vhost '/' refused for user 'router'", class_id=60, method_id=40)
        client.send_method(1, m.ChannelCloseOk())
        assert _count(client, queue) == 2
    finally:
        access.delete_user("router")


def test_a_remembered_route_follows_the_queue_it_named_away_and_back(inproc):
    client = _connected(inproc)
    queue = _declared(client)
    _remembered(inproc, client, queue)
    client.call(2, m.QueueDelete(queue=queue), m.QueueDeleteOk)
    client.publish(1, queue, b"dropped")  # to no queue: dropped (not mandatory)
    client.call(2, m.QueueDeclare(queue=queue, exclusive=True), m.QueueDeclareOk)
    client.publish(1, queue, b"kept")
    inproc.settle()
    assert _count(client, queue) == 1
    got = client.call(2, m.BasicGet(queue=queue, no_ack=True), m.BasicGetOk)
    assert got.message_count == 0 and client.content()[1] == b"kept"


def test_confirm_mode_after_a_remembered_route_confirms_each_publish(inproc):
    client = _connected(inproc)
    queue = _declared(client)
    _remembered(inproc, client, queue)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    client.publish(1, queue, b"confirmed")
    assert client.expect(1, m.BasicAck).delivery_tag == 1


def test_a_transaction_after_a_remembered_route_holds_its_publishes_to_commit(inproc):
    client = _connected(inproc)
    queue = _declared(client)
    _remembered(inproc, client, queue)
    client.call(1, m.TxSelect(), m.TxSelectOk)
    client.publish(1, queue, b"in the transaction")
    inproc.settle()
    assert _count(client, queue) == 2
    client.call(1, m.TxCommit(), m.TxCommitOk)
    assert _count(client, queue) == 3


def test_an_alarm_blocks_a_publisher_whose_route_is_remembered(inproc):
    client = _connected(inproc, capabilities={"connection.blocked": True})
    queue = _declared(client)
    _remembered(inproc, client, queue)
    alarms = inproc.gateway.alarms
    alarms.set(("gateway", "memory"), True)
    try:
        assert client.expect(0, m.ConnectionBlocked).reason == "low on memory"
        client.publish(1, queue, b"held")
        assert client.conn._paused_by, "the connection still reads while blocked"
    finally:
        alarms.set(("gateway", "memory"), False)
    assert client.expect(0, m.ConnectionUnblocked) == m.ConnectionUnblocked()
    inproc.settle()
    assert _count(client, queue) == 3


def test_a_message_over_the_size_limit_is_refused_after_a_remembered_route(inproc):
    client = _connected(inproc)
    queue = _declared(client)
    _remembered(inproc, client, queue)
    client.conn.channels[1].assembler.max_size = 10
    client.publish(1, queue, b"x" * 11)
    assert client.expect(1, m.ChannelClose) == m.ChannelClose(
        reply_code=406, reply_text="PRECONDITION_FAILED - message size 11 is larger than "
        "configured max size 10", class_id=60, method_id=40)


def test_a_remembered_route_still_reads_the_properties_the_broker_acts_on(inproc):
    client = _connected(inproc)
    queue, other = _declared(client), _declared(client)
    _remembered(inproc, client, queue)
    client.publish(1, queue, b"copied", properties=encode_properties(
        BasicProperties(headers={"CC": [other]})))
    inproc.settle()
    assert (_count(client, queue), _count(client, other)) == (3, 1)
