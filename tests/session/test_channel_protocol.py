"""A channel's protocol, in-process (tests/support/session.py): channel_max and channel.open,
a channel the server is closing (crossing channel.close), channel.flow, publisher
confirms and transactions, with RabbitMQ's reply codes and texts. Real clients over
TCP: test_e2e_channels.py, test_e2e_durability.py."""

from __future__ import annotations

import struct

import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

FULL = "NOT_ALLOWED - number of channels opened ({n}) has reached the negotiated channel_max ({n})"
CLOSE_406 = m.ChannelClose(reply_code=406,
                           reply_text="PRECONDITION_FAILED - unknown delivery tag 99",
                           class_id=60, method_id=80)


def connected(inline, **handshake):
    client = inline.client()
    client.handshake(**handshake)
    return client


def expect_connection_close(client, code: int, text: str, class_id: int = 0,
                            method_id: int = 0) -> None:
    close = client.expect_connection_close(code)
    assert (close.reply_text, close.class_id, close.method_id) == (text, class_id, method_id)


def expect_channel_close(client, channel: int, code: int, text: str, class_id: int,
                         method_id: int) -> None:
    """The broker closes `channel` alone; the client's close-ok ends it."""
    assert client.expect(channel, m.ChannelClose) == m.ChannelClose(
        reply_code=code, reply_text=text, class_id=class_id, method_id=method_id)
    client.send_method(channel, m.ChannelCloseOk())


def declare_works(client, channel: int) -> str:
    return client.call(channel, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue


def provoke_406(client, channel: int) -> None:
    """Make the server close `channel`: an ack of a tag never delivered."""
    client.send_method(channel, m.BasicAck(delivery_tag=99))


# -- channel_max ---------------------------------------------------------------------

def test_channel_max_counts_open_channels_whatever_their_numbers(inline):
    client = connected(inline, channel_max=3)
    for number in (3, 7, 9):
        client.open_channel(number)
    declare_works(client, 7)
    client.send_method(11, m.ChannelOpen())
    expect_connection_close(client, 530, FULL.format(n=3))


def test_a_first_channel_may_have_a_number_over_channel_max(inline):
    client = connected(inline, channel_max=3)
    client.open_channel(10)
    declare_works(client, 10)


def test_a_closed_channel_frees_its_place_and_a_closing_one_does_not(inline):
    client = connected(inline, channel_max=2)
    client.open_channel(1)
    client.open_channel(2)
    client.call(2, m.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0),
                m.ChannelCloseOk)
    client.open_channel(5)
    provoke_406(client, 5)
    assert client.expect(5, m.ChannelClose) == CLOSE_406
    client.send_method(6, m.ChannelOpen())  # 5 still counts until its close-ok
    expect_connection_close(client, 530, FULL.format(n=2))


def test_a_full_connection_refuses_any_frame_on_a_new_channel(inline):
    client = connected(inline, channel_max=1)
    client.open_channel(1)
    client.send_method(2, m.QueueDeclare(queue="x"))
    expect_connection_close(client, 530, FULL.format(n=1))


@pytest.mark.parametrize("frame_type, payload, code, text, class_id, method_id", [
    (frames.FRAME_METHOD, m.encode_method(m.QueueDeclare(queue="x")), 504,
     "CHANNEL_ERROR - expected 'channel.open'", 50, 10),
    (frames.FRAME_METHOD, m.encode_method(m.ChannelCloseOk()), 504,
     "CHANNEL_ERROR - expected 'channel.open'", 20, 41),
    (frames.FRAME_HEADER, struct.pack(">HHQH", 60, 0, 5, 0), 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    (frames.FRAME_BODY, b"hello", 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
], ids=["queue.declare", "channel.close-ok", "content header", "content body"])
def test_a_new_channel_must_start_with_channel_open(inline, frame_type, payload, code, text,
                                                    class_id, method_id):
    client = connected(inline)
    client.send_frame(frame_type, 2, payload)
    expect_connection_close(client, code, text, class_id, method_id)


def test_channel_open_on_an_open_channel_is_504(inline):
    client = connected(inline)
    client.open_channel(1)
    client.send_method(1, m.ChannelOpen())
    expect_connection_close(client, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


# -- a channel the server is closing ---------------------------------------------------

def test_crossing_channel_close_gets_close_ok_and_the_channel_reopens(inline):
    client = connected(inline)
    client.open_channel(1)
    provoke_406(client, 1)
    # Sent before the client has read our close: dropped, a publish's content included.
    client.send_method(1, m.BasicPublish(exchange="", routing_key="nowhere"))
    client.send_frame(frames.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 5, 0))
    client.send_frame(frames.FRAME_BODY, 1, b"hello")
    client.send_method(1, m.QueueDeclare(queue="", exclusive=True))
    client.send_method(1, m.ChannelClose(reply_code=200, reply_text="bye", class_id=0,
                                         method_id=0))
    assert client.expect(1, m.ChannelClose) == CLOSE_406
    client.expect(1, m.ChannelCloseOk)
    client.send_method(1, m.ChannelCloseOk())
    client.open_channel(1)
    declare_works(client, 1)


def test_channel_open_on_a_closing_channel_is_504(inline):
    client = connected(inline)
    client.open_channel(1)
    provoke_406(client, 1)
    assert client.expect(1, m.ChannelClose) == CLOSE_406
    client.send_method(1, m.ChannelOpen())
    expect_connection_close(client, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_a_soft_error_closes_its_channel_only(inline):
    client = connected(inline)
    client.open_channel(1)
    client.open_channel(2)
    queue = declare_works(client, 2)
    client.send_method(1, m.QueueDeclare(queue="nowhere-to-be-seen", passive=True))
    expect_channel_close(client, 1, 404,
                         "NOT_FOUND - no queue 'nowhere-to-be-seen' in vhost '/'", 50, 10)
    client.send_method(2, m.BasicPublish(exchange="no-such-exchange", routing_key="k"))
    client.send_frame(frames.FRAME_HEADER, 2, struct.pack(">HHQH", 60, 0, 1, 0))
    client.send_frame(frames.FRAME_BODY, 2, b"x")
    expect_channel_close(client, 2, 404,
                         "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'", 60, 40)
    client.open_channel(1)
    client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)


# -- channel.flow and the order of replies ----------------------------------------------

def test_channel_flow_pauses_and_resumes_deliveries(inline):
    client = connected(inline)
    client.open_channel(1)
    queue = declare_works(client, 1)
    assert client.call(1, m.ChannelFlow(active=False), m.ChannelFlowOk).active is False
    client.call(1, m.BasicConsume(queue=queue, no_ack=True), m.BasicConsumeOk)
    client.publish(1, queue, b"held")
    # The shard answers in order: the message was delivered to the gateway before
    # this reply, and flow is off, so nothing comes before it.
    declared = client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
    assert declared.message_count == 0
    assert client.pending() == []
    assert client.call(1, m.ChannelFlow(active=True), m.ChannelFlowOk).active is True
    assert client.expect(1, m.BasicDeliver).delivery_tag == 1
    assert client.content()[1] == b"held"


def test_deliveries_of_a_flowing_channel_come_before_a_later_reply(inline):
    """The reference for the test above: with flow on, the same delivery is there
    before the declare-ok."""
    client = connected(inline)
    client.open_channel(1)
    queue = declare_works(client, 1)
    client.call(1, m.BasicConsume(queue=queue, no_ack=True), m.BasicConsumeOk)
    client.publish(1, queue, b"flowing")
    client.send_method(1, m.QueueDeclare(queue=queue, passive=True))
    assert client.expect(1, m.BasicDeliver).delivery_tag == 1
    assert client.content()[1] == b"flowing"
    client.expect(1, m.QueueDeclareOk)


def test_queue_delete_ok_comes_before_the_consumers_cancel(inline):
    """kombu deletes a queue from its consumer's own channel and reads delete-ok;
    RabbitMQ sends queue.delete-ok first, basic.cancel after."""
    client = connected(inline, capabilities={"consumer_cancel_notify": True})
    client.open_channel(1)
    client.call(1, m.QueueDeclare(queue="delete-order"), m.QueueDeclareOk)
    client.call(1, m.BasicConsume(queue="delete-order", consumer_tag="c1"), m.BasicConsumeOk)
    client.send_method(1, m.QueueDelete(queue="delete-order"))
    client.expect(1, m.QueueDeleteOk)
    assert client.expect(1, m.BasicCancel).consumer_tag == "c1"


# -- basic.qos -----------------------------------------------------------------------------

def deliveries(client, queue: str) -> list[m.BasicDeliver]:
    """The deliveries the broker sends until it has answered a passive declare of
    `queue` on channel 2 (its shard has then dealt out what it could), and after."""
    client.send_method(2, m.QueueDeclare(queue=queue, passive=True))
    delivered = []
    while True:
        channel, method = client.next_method()
        if type(method) is m.QueueDeclareOk:
            break
        assert (channel, type(method)) == (1, m.BasicDeliver), method
        delivered.append(method)
    return delivered + [m.decode_method(payload) for kind, _, payload in client.pending()
                        if kind == frames.FRAME_METHOD]


def test_a_channel_wide_prefetch_is_shared_by_its_consumers(inline):
    client = connected(inline)
    client.open_channel(1)
    client.open_channel(2)
    first, second = declare_works(client, 1), declare_works(client, 1)
    client.call(1, m.BasicQos(prefetch_count=3, global_=True), m.BasicQosOk)
    for queue in (first, second):
        client.call(1, m.BasicConsume(queue=queue), m.BasicConsumeOk)
    for queue in (first, second):
        for n in range(5):
            client.publish(1, queue, b"%d" % n)
    delivered = deliveries(client, second)
    assert len(delivered) == 3  # of 10 ready, across both consumers
    client.send_method(1, m.BasicAck(delivery_tag=delivered[-1].delivery_tag, multiple=True))
    assert len(deliveries(client, second)) == 3  # three settled, three more
    client.send_method(1, m.BasicQos(prefetch_count=0, global_=True))
    client.expect(1, m.BasicQosOk)
    assert len(deliveries(client, second)) == 4  # no limit: the rest


# -- publisher confirms ---------------------------------------------------------------

def test_confirms_ack_each_message_once_and_unroutable_mandatory_returns_first(inline):
    client = connected(inline)
    client.open_channel(1)
    client.send_method(1, m.ConfirmSelect(nowait=True))  # no select-ok with nowait
    queue = declare_works(client, 1)
    for _ in range(9):
        client.publish(1, queue, b"x")
    client.publish(1, "nowhere", b"lost", mandatory=True)
    answered = set()
    seen_return = False
    while len(answered) < 10:
        _, method = client.next_method()
        if isinstance(method, m.BasicReturn):
            assert method.reply_code == 312 and method.reply_text == "NO_ROUTE"
            assert 10 not in answered  # basic.return goes out before the ack
            seen_return = True
            continue
        assert isinstance(method, m.BasicAck), method
        if method.multiple:  # everything not yet answered up to the tag
            tags = [t for t in range(1, method.delivery_tag + 1) if t not in answered]
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            assert tag not in answered
            answered.add(tag)
    assert answered == set(range(1, 11)) and seen_return


def test_a_refused_publish_is_not_confirmed_and_closes_the_channel(inline):
    client = connected(inline)
    client.open_channel(1)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    queue = declare_works(client, 1)
    client.publish(1, queue, b"one")
    assert client.expect(1, m.BasicAck).delivery_tag == 1
    client.publish(1, queue, b"two", properties=b"\x01\x00\x05-5000")
    expect_channel_close(client, 1, 406,
                         "PRECONDITION_FAILED - invalid expiration '-5000': "
                         "{value_negative,-5000}", 60, 40)
    assert client.pending() == []  # no ack for it


# -- transactions ------------------------------------------------------------------------

def test_transaction_commit_and_rollback_of_publishes_and_acks(inline):
    client = connected(inline)
    client.open_channel(1)
    queue = declare_works(client, 1)
    client.call(1, m.TxSelect(), m.TxSelectOk)
    client.publish(1, queue, b"rolled back")
    client.call(1, m.TxRollback(), m.TxRollbackOk)
    client.publish(1, queue, b"committed")
    declared = client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
    assert declared.message_count == 0  # not before commit
    client.call(1, m.TxCommit(), m.TxCommitOk)
    declared = client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
    assert declared.message_count == 1
    got = client.call(1, m.BasicGet(queue=queue), m.BasicGetOk)
    assert client.content()[1] == b"committed"
    client.send_method(1, m.BasicAck(delivery_tag=got.delivery_tag))
    client.call(1, m.TxRollback(), m.TxRollbackOk)
    # The ack is undone: the message is still unacked here, and can be acked again.
    client.send_method(1, m.BasicAck(delivery_tag=got.delivery_tag))
    client.call(1, m.TxCommit(), m.TxCommitOk)
    client.call(1, m.BasicRecover(requeue=True), m.BasicRecoverOk)
    declared = client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
    assert declared.message_count == 0  # acked by the commit: recover brought nothing back


def test_a_committed_publish_is_stored_before_commit_ok(inline):
    client = connected(inline)
    client.open_channel(1)
    client.call(1, m.QueueDeclare(queue="tx.stored", durable=True), m.QueueDeclareOk)
    client.call(1, m.QueuePurge(queue="tx.stored"), m.QueuePurgeOk)
    client.call(1, m.TxSelect(), m.TxSelectOk)
    for n in range(5):
        client.publish(1, "tx.stored", b"m%d" % n, properties=b"\x10\x00\x02")  # persistent
    client.call(1, m.TxCommit(), m.TxCommitOk)
    other = connected(inline)
    other.open_channel(1)
    declared = other.call(1, m.QueueDeclare(queue="tx.stored", durable=True, passive=True),
                          m.QueueDeclareOk)
    assert declared.message_count == 5


@pytest.mark.parametrize("method", [m.TxCommit(), m.TxRollback()], ids=["commit", "rollback"])
def test_commit_or_rollback_outside_a_transaction_is_406(inline, method):
    client = connected(inline)
    client.open_channel(1)
    client.send_method(1, method)
    expect_channel_close(client, 1, 406, "PRECONDITION_FAILED - channel is not transactional",
                         method.CLASS_ID, method.METHOD_ID)


def test_tx_and_confirm_modes_exclude_each_other(inline):
    client = connected(inline)
    client.open_channel(1)
    client.call(1, m.TxSelect(), m.TxSelectOk)
    client.call(1, m.TxSelect(), m.TxSelectOk)  # again: no error
    client.send_method(1, m.ConfirmSelect())
    expect_channel_close(client, 1, 406,
                         "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)
    client.open_channel(2)
    client.call(2, m.ConfirmSelect(), m.ConfirmSelectOk)
    client.send_method(2, m.TxSelect())
    expect_channel_close(client, 2, 406,
                         "PRECONDITION_FAILED - cannot switch from confirm to tx mode", 90, 10)
