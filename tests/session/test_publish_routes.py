"""The routes a connection remembers (gateway/publishing.py, Route), in-process
(tests/support/session.py): a publish like an earlier one goes where the full routing
would send it now, whatever changed in between (bindings, queues, permissions,
the channel's mode, a resource alarm, the message's own properties)."""

from __future__ import annotations

import itertools
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.hotpath import ACK_IDS
from warren.gateway.amqp.properties import BasicProperties, encode_properties
from warren.gateway.session.publishing import ROUTES_KEPT
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


def _take(frame, answers: list, acked: dict) -> None:
    """A frame from the broker: a confirm's tags go to `acked` (by channel), any
    other method's ids to `answers`."""
    kind, channel, payload = frame
    if kind != frames.FRAME_METHOD:
        return
    if payload[:4] == ACK_IDS:  # one confirm, or all up to a tag
        tag, multiple = struct.unpack_from(">QB", payload, 4)
        acked[channel] |= set(range(1, tag + 1)) if multiple else {tag}
    else:
        answers.append(payload[:4])


def _connected(inline, **handshake):
    client = inline.client()
    client.handshake(**handshake)
    for channel in (1, 2):
        client.open_channel(channel)
    return client


@pytest.mark.parametrize("confirm", [False, True], ids=["plain", "confirm"])
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=st.lists(st.one_of(publishes, publishes, bindings, queue_changes), min_size=1,
                       max_size=25))
def test_a_remembered_route_sends_what_full_routing_sends(inline, confirm, script):
    """Each publish goes out twice on channel 1 (the second time by the route the
    connection remembered) and once on channel 2 with the routes forgotten: the shard
    gets the same records each time (in confirm mode each numbered in its
    channel's sequence) and the client the same returns and confirms, as bindings
    and queues change between them."""
    n = next(_examples)
    client = _connected(inline)
    names = [f"routes{n}.q{i}" for i in range(QUEUES)]
    for name in names:
        client.call(1, m.QueueDeclare(queue=name, exclusive=True), m.QueueDeclareOk)
    channels = client.conn.channels
    published = {1: 0, 2: 0}
    acked: dict[int, set] = {1: set(), 2: set()}  # delivery tags confirmed by the broker
    if confirm:
        for channel in (1, 2):
            client.call(channel, m.ConfirmSelect(), m.ConfirmSelectOk)
    link = inline.gateway.shards.links[0]
    sent = _recording(link)
    try:
        for step in script:
            if step[0] == "publish":
                _, exchange, key, kind, mandatory = step
                key = names[int(key[1])] if key in ("q0", "q1") else key
                outcomes = []
                for channel in (1, 1, 2):
                    if channel == 2:
                        client.conn.routes.clear()
                    client.publish(channel, key, b"m", exchange, mandatory, PROPERTIES[kind])
                    published[channel] += 1
                    answers = []  # the ids of the methods that came, acks aside
                    for frame in client.pending():
                        _take(frame, answers, acked)
                    while confirm and published[channel] not in acked[channel]:
                        _take(client.next_frame(), answers, acked)  # confirmed after a commit
                    if confirm:
                        assert all((record.confirm_channel, record.confirm_seq)
                                   == (channels[channel].id, published[channel])
                                   for record in sent), (step, sent)
                    records = [msgspec.structs.replace(record, confirm_channel=0, confirm_seq=0)
                               for record in sent]
                    outcomes.append((records, answers))
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
        assert not channels[1].closing and not channels[2].closing
        if confirm:  # every publish confirmed, once
            for channel in (1, 2):
                assert acked[channel] == set(range(1, published[channel] + 1))
    finally:
        del link.send


def _declared(client) -> str:
    """A new exclusive queue, by a name of the test's own (a server-named one could
    not be declared again)."""
    name = f"routes.q{next(_examples)}"
    client.call(1, m.QueueDeclare(queue=name, exclusive=True), m.QueueDeclareOk)
    return name


def _remembered(inline, client, queue: str, properties: bytes = b"\x00\x00") -> None:
    """Publish to `queue` until channel 1 remembers the route."""
    channel = client.conn.channels[1]
    for _ in range(2):
        client.publish(1, queue, b"m", properties=properties)
    inline.settle()
    assert channel._routes, "the connection remembered no route"


def _remembering(inline, **handshake):
    """A client, and a queue its channel 1 has published to until it remembers the route."""
    client = _connected(inline, **handshake)
    queue = _declared(client)
    _remembered(inline, client, queue)
    return client, queue


def _count(client, queue: str) -> int:
    return client.call(2, m.QueueDeclare(queue=queue, passive=True),
                       m.QueueDeclareOk).message_count


def test_a_remembered_route_is_refused_once_write_permission_is_gone(inline):
    access = inline.gateway.access
    access.put_user("router", "secret", [])
    access.set_permissions("router", "/", ".*", ".*", ".*")
    try:
        client = _connected(inline, user="router", password="secret")
        queue = _declared(client)
        _remembered(inline, client, queue)
        access.set_permissions("router", "/", ".*", "", ".*")
        client.publish(1, queue, b"refused")
        assert client.expect(1, m.ChannelClose) == m.ChannelClose(
            reply_code=403, reply_text="ACCESS_REFUSED - access to exchange 'amq.default' in "
            "vhost '/' refused for user 'router'", class_id=60, method_id=40)
        client.send_method(1, m.ChannelCloseOk())
        assert _count(client, queue) == 2
    finally:
        access.delete_user("router")


def test_a_remembered_route_follows_the_queue_it_named_away_and_back(inline):
    client, queue = _remembering(inline)
    client.call(2, m.QueueDelete(queue=queue), m.QueueDeleteOk)
    client.publish(1, queue, b"dropped")  # to no queue: dropped (not mandatory)
    client.call(2, m.QueueDeclare(queue=queue, exclusive=True), m.QueueDeclareOk)
    client.publish(1, queue, b"kept")
    inline.settle()
    assert _count(client, queue) == 1
    got = client.call(2, m.BasicGet(queue=queue, no_ack=True), m.BasicGetOk)
    assert got.message_count == 0 and client.content()[1] == b"kept"


def test_confirm_mode_after_a_remembered_route_confirms_each_publish(inline):
    client, queue = _remembering(inline)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    client.publish(1, queue, b"confirmed")
    assert client.expect(1, m.BasicAck).delivery_tag == 1


def test_a_transaction_after_a_remembered_route_holds_its_publishes_to_commit(inline):
    client, queue = _remembering(inline)
    client.call(1, m.TxSelect(), m.TxSelectOk)
    client.publish(1, queue, b"in the transaction")
    inline.settle()
    assert _count(client, queue) == 2
    client.call(1, m.TxCommit(), m.TxCommitOk)
    assert _count(client, queue) == 3


def test_an_alarm_blocks_a_publisher_whose_route_is_remembered(inline):
    client, queue = _remembering(inline, capabilities={"connection.blocked": True})
    alarms = inline.gateway.alarms
    alarms.set(("gateway", "memory"), True)
    try:  # blocked at its next publish, which the remembered route does not let through
        received = inline.gateway.totals.received
        client.publish(1, queue, b"held")
        assert client.expect(0, m.ConnectionBlocked).reason == "low on memory"
        assert client.conn.paused_by, "the connection still reads while blocked"
        assert inline.gateway.totals.received == received
    finally:
        alarms.set(("gateway", "memory"), False)
    assert client.expect(0, m.ConnectionUnblocked) == m.ConnectionUnblocked()
    inline.settle()
    assert _count(client, queue) == 3


def test_a_message_over_the_size_limit_is_refused_after_a_remembered_route(inline):
    client, queue = _remembering(inline)
    client.conn.channels[1].assembler.max_size = 10
    client.publish(1, queue, b"x" * 11)
    assert client.expect(1, m.ChannelClose) == m.ChannelClose(
        reply_code=406, reply_text="PRECONDITION_FAILED - message size 11 is larger than "
        "configured max size 10", class_id=60, method_id=40)


def test_a_remembered_route_still_reads_the_properties_the_broker_acts_on(inline):
    client = _connected(inline)
    queue, other = _declared(client), _declared(client)
    _remembered(inline, client, queue)
    client.publish(1, queue, b"copied", properties=encode_properties(
        BasicProperties(headers={"CC": [other]})))
    inline.settle()
    assert (_count(client, queue), _count(client, other)) == (3, 1)


def test_a_confirm_by_a_remembered_route_waits_for_the_queue_to_take_the_message(inline):
    """A full queue that rejects publishes: the publish by a remembered route is
    nacked, as the first one to the full queue was."""
    client = _connected(inline)
    queue = f"routes.q{next(_examples)}"
    client.call(1, m.QueueDeclare(queue=queue, exclusive=True, arguments={
        "x-max-length": 1, "x-overflow": "reject-publish"}), m.QueueDeclareOk)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    answers = []
    for tag in (1, 2, 3):
        client.publish(1, queue, b"m")
        answers.append(client.next_method()[1])
    assert [(type(a), a.delivery_tag) for a in answers] == [
        (m.BasicAck, 1), (m.BasicNack, 2), (m.BasicNack, 3)]
    assert client.conn.routes, "the connection remembered no route"


def test_a_confirm_by_a_remembered_route_to_a_shard_that_is_down_is_a_nack(inline,
                                                                            monkeypatch):
    client = _connected(inline)
    queue = _declared(client)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    _remembered(inline, client, queue)
    assert client.expect(1, m.BasicAck).delivery_tag in (1, 2)
    link = inline.gateway.shards.links[0]
    monkeypatch.setattr(link, "alive", False)  # as between its death and its restart
    client.publish(1, queue, b"lost")
    while type(method := client.next_method()[1]) is m.BasicAck:
        assert method.delivery_tag == 2  # the first two, if confirmed one by one
    assert (type(method), method.delivery_tag) == (m.BasicNack, 3)


def test_a_connection_remembers_a_bounded_number_of_routes(inline):
    """A publisher that changes its routing key with every message (each to no
    queue) costs the gateway at most ROUTES_KEPT routes."""
    client = _connected(inline)
    for n in range(ROUTES_KEPT + 10):
        client.publish(1 + n % 2, f"nowhere.{n}", b"m")
    inline.settle()
    assert 0 < len(client.conn.routes) <= ROUTES_KEPT
    assert client.pending() == []  # dropped, as unroutable publishes are
