"""Consumer rules that need no real client, in-process: a consumer that misses its
heartbeats is dropped and its unacked delivery goes back to the queue, marked
redelivered; basic.recover-async redelivers without a reply.
tests/e2e/test_e2e_consumer_rules.py has the rest, with real clients."""

from __future__ import annotations

from warren.gateway.amqp import methods as m


def test_missed_heartbeats_requeue_unacked_deliveries(inline):
    other = inline.client()
    other.handshake()
    other.open_channel(1)
    queue = other.call(1, m.QueueDeclare(queue="heartbeat-requeue"), m.QueueDeclareOk).queue
    other.publish(1, queue, b"0")
    silent = inline.client()
    silent.handshake(heartbeat=1)
    silent.open_channel(1)
    silent.send_method(1, m.BasicConsume(queue=queue))
    while not isinstance(silent.next_method()[1], m.BasicDeliver):
        pass
    # It never speaks again: after two intervals the broker drops the connection
    # (the clock moves on through its heartbeat ticks) and the message goes back.
    assert inline.run(lambda: silent.wire.closed)
    other.call(1, m.BasicConsume(queue=queue, no_ack=True), m.BasicConsumeOk)
    assert other.expect(1, m.BasicDeliver).redelivered is True
    assert other.content()[1] == b"0"
    other.call(1, m.QueueDelete(queue=queue), m.QueueDeleteOk)


def test_recover_async_redelivers_without_a_reply(inline):
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    queue = client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    client.publish(1, queue, b"x")
    client.send_method(1, m.BasicConsume(queue=queue))
    methods = [client.next_method()[1] for _ in range(2)]
    assert [type(x) for x in methods] == [m.BasicConsumeOk, m.BasicDeliver]
    assert methods[1].redelivered is False
    client.send_method(1, m.BasicRecoverAsync(requeue=True))
    _, again = client.next_method()
    assert isinstance(again, m.BasicDeliver)  # no recover-ok comes first
    assert again.redelivered is True and again.delivery_tag == 2
