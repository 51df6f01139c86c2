"""A consumer's delivery window, in-process (tests/support/session.py): the gateway gives the
shard its credit back in chunks, never a record (and a shard wake-up) per write.
And a publisher's credit follows the consumers: publishing into a queue whose
consumers are behind costs more, until they catch up."""

from __future__ import annotations

from warren.gateway.amqp import methods as m
from warren.gateway.session.consuming import FLOW_WINDOW, GRANT_BELOW
from warren.shards import records as r
from warren.shards.shard import BACKLOG_STEP

MESSAGES = 3 * FLOW_WINDOW


def a_queue(inline):
    """A client with channel 1 open, its exclusive queue, that queue as the gateway
    holds it and the link to its shard."""
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    queue = client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    meta = inline.gateway.catalogue.vhosts["/"].queues[queue]
    return client, queue, meta, inline.gateway.shards[meta.shard]


def test_a_no_ack_consumer_gives_credit_back_in_chunks(inline):
    client, queue, _meta, link = a_queue(inline)
    grants = []
    send = link.send

    def counting(record, feeder=None):
        if type(record) is r.Grant:
            grants.append(record.credit)
        send(record, feeder)

    link.send = counting
    try:
        client.call(1, m.BasicConsume(queue=queue, no_ack=True), m.BasicConsumeOk)
        for n in range(MESSAGES):  # one by one: each delivery its own socket write
            client.publish(1, queue, b"%d" % n)
            assert type(client.expect(1, m.BasicDeliver)) is m.BasicDeliver
            assert client.content()[1] == b"%d" % n
    finally:
        del link.send
    # The shard never ran dry (every message came), and its credit came back in
    # chunks of at least half the window.
    assert grants and all(credit >= FLOW_WINDOW - GRANT_BELOW for credit in grants)
    assert len(grants) <= MESSAGES // (FLOW_WINDOW - GRANT_BELOW)
    client.close()


def test_publishing_into_a_backlog_its_consumers_are_behind_on_costs_more_until_it_goes(
        inline):
    client, queue, meta, link = a_queue(inline)
    client.call(1, m.BasicQos(prefetch_count=1), m.BasicQosOk)
    client.call(1, m.BasicConsume(queue=queue), m.BasicConsumeOk)  # and never acks
    for n in range(BACKLOG_STEP + 2):
        client.publish(1, queue, b"%d" % n)
    assert inline.run(lambda: link.costs.get(meta.qid) == 2)  # every gateway is told
    assert type(client.expect(1, m.BasicDeliver)) is m.BasicDeliver  # its one in flight
    client.content()
    client.call(1, m.QueuePurge(queue=queue), m.QueuePurgeOk)  # the backlog is gone
    assert inline.run(lambda: meta.qid not in link.costs)
    client.close()
