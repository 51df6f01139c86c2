"""Channel errors with RabbitMQ's reply codes and texts, in-process (tests/support/session.py):
declarations on the default and system exchanges, exclusive queues, quorum queue
properties, delivery tags, basic.qos, expiration, direct reply-to, lock renewal.
Each error closes its channel alone: the same connection then carries on. Real
clients over TCP keep the most visible cases (test_e2e_routing.py,
test_e2e_protocol_errors.py, test_e2e_access.py, test_e2e_channels.py)."""

from __future__ import annotations

import itertools

import pytest

from warren.gateway.amqp import methods as m
from warren.gateway.amqp.properties import BasicProperties, encode_properties

_names = itertools.count(1)
DEFAULT = "ACCESS_REFUSED - operation not permitted on the default exchange"


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def locked(queue: str) -> str:
    """RabbitMQ's text for an exclusive queue one may not use or redeclare so."""
    return (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in "
            "vhost '/'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.")


class Session:
    """One connection; each step gets a channel of its own."""

    def __init__(self, inline):
        self.client = inline.client()
        self.client.handshake(capabilities={"consumer_cancel_notify": True})
        self.numbers = itertools.count(1)

    def channel(self) -> int:
        number = next(self.numbers)
        self.client.open_channel(number)
        return number

    def ok(self, method, kind: type, channel: int | None = None):
        """Send `method` on a new channel (or `channel`); its answer must be a `kind`."""
        return self.client.call(self.channel() if channel is None else channel, method, kind)

    def refused(self, method, code: int, text: str, channel: int | None = None) -> None:
        """Send `method` on a new channel (or `channel`): the broker closes that channel
        with `code` and `text`, naming the method, and the connection lives on."""
        number = self.channel() if channel is None else channel
        self.client.send_method(number, method)
        self.closed(number, code, text, method.CLASS_ID, method.METHOD_ID)

    def closed(self, number: int, code: int, text: str, class_id: int, method_id: int) -> None:
        close = self.client.expect(number, m.ChannelClose)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            code, text, class_id, method_id)
        self.client.send_method(number, m.ChannelCloseOk())

    def publish(self, channel: int, exchange: str, routing_key: str, **properties) -> None:
        self.client.publish(channel, routing_key, b"x", exchange=exchange,
                            properties=encode_properties(BasicProperties(**properties)))


@pytest.fixture
def session(inline) -> Session:
    return Session(inline)


# -- the default and system exchanges ---------------------------------------------------

MISSING = "amq.missing-1"


@pytest.mark.parametrize("make, code, text", [
    (lambda q: m.ExchangeDeclare(exchange="", passive=True), 403, DEFAULT),
    (lambda q: m.ExchangeDeclare(exchange="", type="direct"), 403, DEFAULT),
    (lambda q: m.ExchangeDelete(exchange=""), 403, DEFAULT),
    (lambda q: m.QueueBind(queue=q, exchange=""), 403, DEFAULT),
    (lambda q: m.QueueUnbind(queue=q, exchange=""), 403, DEFAULT),
    (lambda q: m.ExchangeBind(destination="amq.fanout", source=""), 403, DEFAULT),
    (lambda q: m.ExchangeBind(destination="", source="amq.fanout"), 403, DEFAULT),
    (lambda q: m.ExchangeUnbind(destination="amq.fanout", source=""), 403, DEFAULT),
    (lambda q: m.ExchangeUnbind(destination="", source="amq.fanout"), 403, DEFAULT),
    (lambda q: m.ExchangeDelete(exchange="amq.headers"), 403,
     "ACCESS_REFUSED - deletion of system exchange 'amq.headers' in vhost '/' not allowed"),
    (lambda q: m.ExchangeDelete(exchange=MISSING), 403,
     f"ACCESS_REFUSED - deletion of system exchange '{MISSING}' in vhost '/' not allowed"),
    (lambda q: m.ExchangeDeclare(exchange="amq.mine", type="direct"), 403,
     "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'"),
    (lambda q: m.ExchangeDeclare(exchange="amq.mine", passive=True), 404,
     "NOT_FOUND - no exchange 'amq.mine' in vhost '/'"),
    (lambda q: m.QueueDeclare(queue="amq.mine"), 403,
     "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'"),
    (lambda q: m.ExchangeDeclare(exchange="amq.direct", type="fanout", durable=True), 406,
     "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': "
     "received 'fanout' but current is 'direct'"),
], ids=["declare-default-passive", "declare-default", "delete-default", "bind-to-default",
        "unbind-from-default", "bind-default-as-source", "bind-default-as-destination",
        "unbind-default-as-source", "unbind-default-as-destination", "delete-amq.headers",
        "delete-missing-amq.name", "declare-amq.name", "declare-missing-amq.name-passive",
        "declare-queue-amq.name", "redeclare-amq.direct-as-fanout"])
def test_default_and_system_exchanges_are_protected(session, make, code, text):
    """Every operation on the default exchange, a passive declaration included, and
    the creation or deletion of amq.* names answer as RabbitMQ 3.10 does."""
    queue = session.ok(m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    session.refused(make(queue), code, text)
    session.ok(m.ExchangeDeclare(exchange="amq.direct", passive=True), m.ExchangeDeclareOk)
    session.ok(m.ExchangeDeclare(exchange="amq.direct", type="direct", durable=True),
               m.ExchangeDeclareOk)  # as it is: fine


def test_an_unknown_exchange_type_closes_the_connection_before_any_other_check(session):
    session.client.send_method(session.channel(),
                               m.ExchangeDeclare(exchange="", type="no-such-type"))
    close = session.client.expect_connection_close(503)
    assert close.reply_text == "COMMAND_INVALID - unknown exchange type 'no-such-type'"


# -- exclusive queues ------------------------------------------------------------------

def test_exclusive_queue_redeclared_or_used_elsewhere_is_locked(inline):
    """RabbitMQ's strict check on redeclaration: the exclusive flag must match even on
    the owning connection; other connections cannot use the queue at all."""
    owner, other = Session(inline), Session(inline)
    exclusive, shared = unique("excl"), unique("shared")
    ch = owner.channel()
    for method in (m.QueueDeclare(queue=exclusive, exclusive=True),
                   m.QueueDeclare(queue=shared, auto_delete=True),
                   m.QueueDeclare(queue=exclusive, exclusive=True),  # as it is: fine
                   m.QueueDeclare(queue=exclusive, exclusive=True, durable=True),  # ignored
                   m.QueueDeclare(queue=exclusive, passive=True)):
        owner.ok(method, m.QueueDeclareOk, ch)
    cases = [
        (owner, m.QueueDeclare(queue=exclusive), exclusive),
        (owner, m.QueueDeclare(queue=shared, exclusive=True, auto_delete=True), shared),
        (other, m.QueueDeclare(queue=exclusive, exclusive=True), exclusive),
        (other, m.QueueDeclare(queue=exclusive), exclusive),
        (other, m.QueueDeclare(queue=exclusive, passive=True), exclusive),
        (other, m.QueueBind(queue=exclusive, exchange="amq.direct", routing_key="k"), exclusive),
        (other, m.QueuePurge(queue=exclusive), exclusive),
        (other, m.QueueDelete(queue=exclusive), exclusive),
        (other, m.BasicConsume(queue=exclusive), exclusive),
    ]
    for session, method, name in cases:
        session.refused(method, 405, locked(name))
    declared = owner.ok(m.QueueDeclare(queue=exclusive, passive=True), m.QueueDeclareOk)
    assert declared.queue == exclusive  # still there


def test_an_exclusive_consumer_keeps_others_off_with_403(session):
    queue = session.ok(m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    session.ok(m.BasicConsume(queue=queue, exclusive=True), m.BasicConsumeOk)
    session.refused(m.BasicConsume(queue=queue), 403,
                    f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")


# -- quorum queues -----------------------------------------------------------------------

@pytest.mark.parametrize("flags, text", [
    ({"durable": False}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    ({"durable": True, "exclusive": True},
     "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ({"durable": True, "auto_delete": True},
     "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    # RabbitMQ's order: auto-delete, then exclusive, then non-durable
    ({"durable": False, "exclusive": True, "auto_delete": True},
     "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    ({"durable": False, "exclusive": True},
     "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
], ids=["non-durable", "exclusive", "auto-delete", "all-three", "exclusive-non-durable"])
def test_quorum_queue_properties_are_checked_in_rabbitmqs_order(session, flags, text):
    name = unique("bad")
    session.refused(m.QueueDeclare(queue=name, arguments={"x-queue-type": "quorum"}, **flags),
                    406, "PRECONDITION_FAILED - " + text.format(q=name))


def test_stream_arguments_and_a_changed_queue_type_are_refused(session):
    name = unique("s")
    session.refused(m.QueueDeclare(queue=name, durable=True, arguments={
        "x-queue-type": "stream", "x-message-ttl": 5}), 406,
        f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{name}' in "
        "vhost '/' of queue type rabbit_stream_queue")
    name = unique("qq")
    session.ok(m.QueueDeclare(queue=name, durable=True, arguments={"x-queue-type": "quorum"}),
               m.QueueDeclareOk)
    session.refused(m.QueueDeclare(queue=name, durable=True), 406,  # redeclared as classic
                    f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{name}' "
                    "in vhost '/': received none but current is the value 'quorum' of type "
                    "'longstr'")


# -- deliveries and their tags --------------------------------------------------------------

@pytest.mark.parametrize("mistake", ["twice", "unknown", "other channel"])
def test_bad_delivery_tag_is_406_with_rabbitmq_text(session, mistake):
    ch = session.channel()
    queue = session.ok(m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk, ch).queue
    session.client.publish(ch, queue, b"x")
    got = session.ok(m.BasicGet(queue=queue), m.BasicGetOk, ch)
    assert got.delivery_tag == 1  # tags start at 1 per channel
    session.client.content()
    if mistake == "twice":
        session.client.send_method(ch, m.BasicAck(delivery_tag=1))
        bad = 1
    elif mistake == "unknown":
        bad = 99
    else:
        ch = session.channel()  # tag 1 exists only on the first channel
        bad = 1
    session.refused(m.BasicAck(delivery_tag=bad), 406,
                    f"PRECONDITION_FAILED - unknown delivery tag {bad}", ch)


def test_prefetch_size_is_refused_as_rabbitmq_does(session):
    session.client.send_method(session.channel(), m.BasicQos(prefetch_size=1000,
                                                             prefetch_count=1))
    close = session.client.expect_connection_close(540)
    assert close.reply_text == "NOT_IMPLEMENTED - prefetch_size!=0 (1000)"


def test_invalid_expiration_closes_the_channel(session):
    ch = session.channel()
    queue = session.ok(m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk, ch).queue
    session.publish(ch, "", queue, expiration="soon")
    session.closed(ch, 406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer", 60, 40)


def test_direct_reply_to_errors(session):
    session.refused(m.BasicConsume(queue="amq.rabbitmq.reply-to", no_ack=False), 406,
                    "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    ch = session.channel()
    session.publish(ch, "", "anything", reply_to="amq.rabbitmq.reply-to")
    session.closed(ch, 406, "PRECONDITION_FAILED - fast reply consumer does not exist", 60, 40)


def test_renewal_of_an_unknown_delivery_is_an_error(session):
    ch = session.channel()
    queue = unique("qq")
    session.ok(m.QueueDeclare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"}),
               m.QueueDeclareOk, ch)
    session.ok(m.BasicConsume(queue=queue, consumer_tag="w"), m.BasicConsumeOk, ch)
    session.publish(ch, "amq.warren.renew", "w", headers={"x-delivery-tag": 999})
    session.closed(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 999", 60, 40)
    ch = session.channel()
    session.publish(ch, "amq.warren.renew", "nobody", headers={"x-renew-all": True})
    session.closed(ch, 406, "PRECONDITION_FAILED - unknown consumer tag 'nobody'", 60, 40)
