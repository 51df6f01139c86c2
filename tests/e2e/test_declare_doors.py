"""One declaration path (gateway/declare.py): AMQP, the management API and
definitions import refuse the same bad declaration for the same reason, in
RabbitMQ 3.10's words (AMQP 406 PRECONDITION_FAILED and its text, HTTP 400 with
{"error": "bad_request", "reason": the text without its reply name}), and accept
the same good one."""

from __future__ import annotations

from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from ..support.broker import managed_broker
from .test_management_api import call

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes

# (arguments, RabbitMQ 3.10's text after "invalid arg '<name>' for queue ...: ")
BAD_QUEUES = [
    ({"x-max-length": "abc"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-max-priority": 300}, "x-max-priority", "{max_value_exceeded,300}"),
    ({"x-queue-type": "foo"}, "x-queue-type", "\"unsupported queue type 'foo'\""),
    ({"x-overflow": "bogus"}, "x-overflow", "invalid_overflow"),
    ({"x-queue-mode": "x"}, "x-queue-mode", "\"unsupported queue mode 'x'\""),
    ({"x-single-active-consumer": "yes"}, "x-single-active-consumer",
     "{unacceptable_type,longstr}"),
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key",
     "routing_key_but_no_dlx_defined"),
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    yield from managed_broker(tmp_path_factory, "doors", shards=2)


def amqp_refusal(broker, declare) -> tuple[int, str]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            declare(conn.channel())
        return raised.value.reply_code, raised.value.reply_text
    finally:
        conn.close()


def imported(broker, **sections) -> tuple[int, dict | None]:
    return call(broker, "POST", "/api/definitions", sections)


def queue_names(broker) -> set[str]:
    return {q["name"] for q in call(broker, "GET", "/api/queues/%2F", None)[1]}


@pytest.mark.parametrize("arguments,name,detail", BAD_QUEUES, ids=[a for _, a, _ in BAD_QUEUES])
def test_three_doors_refuse_a_bad_queue_alike(broker, arguments, name, detail):
    queue = f"bad-{name}"
    reason = f"invalid arg '{name}' for queue '{queue}' in vhost '/': {detail}"
    assert amqp_refusal(broker, lambda ch: ch.queue_declare(queue, arguments=arguments)) == (
        406, f"PRECONDITION_FAILED - {reason}")
    assert call(broker, "PUT", f"/api/queues/%2F/{quote(queue)}",
                {"durable": True, "arguments": arguments}) == (
        400, {"error": "bad_request", "reason": reason})
    status, body = imported(broker, queues=[{"name": queue, "vhost": "/", "durable": True,
                                             "auto_delete": False, "arguments": arguments}])
    assert (status, body["problems"]) == (400, [f"queues[0]: PRECONDITION_FAILED - {reason}"])
    assert queue not in queue_names(broker)


def test_three_doors_refuse_a_quorum_queue_that_is_not_durable_alike(broker):
    reason = "invalid property 'non-durable' for queue 'q-transient' in vhost '/'"
    arguments = {"x-queue-type": "quorum"}
    assert amqp_refusal(broker, lambda ch: ch.queue_declare("q-transient", arguments=arguments)) \
        == (406, f"PRECONDITION_FAILED - {reason}")
    assert call(broker, "PUT", "/api/queues/%2F/q-transient",
                {"durable": False, "arguments": arguments}) == (
        400, {"error": "bad_request", "reason": reason})
    status, body = imported(broker, queues=[{"name": "q-transient", "vhost": "/",
                                             "durable": False, "arguments": arguments}])
    assert body["problems"] == [f"queues[0]: PRECONDITION_FAILED - {reason}"]


def test_three_doors_refuse_a_bad_exchange_alike(broker):
    reason = ("invalid type 'signedint' for arg 'alternate-exchange' in exchange 'x-bad' in "
              "vhost '/'")
    arguments = {"alternate-exchange": 5}
    assert amqp_refusal(broker, lambda ch: ch.exchange_declare("x-bad", "direct",
                                                               arguments=arguments)) == (
        406, f"PRECONDITION_FAILED - {reason}")
    assert call(broker, "PUT", "/api/exchanges/%2F/x-bad",
                {"type": "direct", "arguments": arguments}) == (
        400, {"error": "bad_request", "reason": reason})
    status, body = imported(broker, exchanges=[{"name": "x-bad", "vhost": "/",
                                                "type": "direct", "arguments": arguments}])
    assert body["problems"] == [f"exchanges[0]: PRECONDITION_FAILED - {reason}"]


def test_a_redeclaration_must_be_equivalent_through_amqp_and_http(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare("same", durable=True, arguments={"x-max-length": 5})
    conn.close()
    # the same declaration again is fine through either door
    assert call(broker, "PUT", "/api/queues/%2F/same",
                {"durable": True, "arguments": {"x-max-length": 5}})[0] == 204
    reason = ("inequivalent arg 'durable' for queue 'same' in vhost '/': received 'false' but "
              "current is 'true'")
    assert amqp_refusal(broker, lambda ch: ch.queue_declare(
        "same", durable=False, arguments={"x-max-length": 5})) == (
        406, f"PRECONDITION_FAILED - {reason}")
    assert call(broker, "PUT", "/api/queues/%2F/same",
                {"durable": False, "arguments": {"x-max-length": 5}}) == (
        400, {"error": "bad_request", "reason": reason})
    status, body = call(broker, "PUT", "/api/queues/%2F/same",
                        {"durable": True, "arguments": {"x-max-length": 6}})
    assert status == 400 and body["reason"].startswith(
        "inequivalent arg 'x-max-length' for queue 'same' in vhost '/'")


def test_reserved_names_and_missing_binding_ends_are_refused_by_both_doors(broker):
    reason = "queue name 'amq.mine' contains reserved prefix 'amq.*'"
    assert amqp_refusal(broker, lambda ch: ch.queue_declare("amq.mine")) == (
        403, f"ACCESS_REFUSED - {reason}")
    # RabbitMQ's management API answers a refused access with 401
    assert call(broker, "PUT", "/api/queues/%2F/amq.mine", {}) == (
        401, {"error": "not_authorised", "reason": reason})
    assert "amq.mine" not in queue_names(broker)
    reason = "no queue 'nowhere' in vhost '/'"
    assert amqp_refusal(broker, lambda ch: ch.queue_bind("nowhere", "amq.direct", "k")) == (
        404, f"NOT_FOUND - {reason}")
    assert call(broker, "POST", "/api/bindings/%2F/e/amq.direct/q/nowhere", {}) == (
        404, {"error": "not_found", "reason": reason})


def test_a_good_declaration_creates_the_same_queue_through_every_door(broker):
    arguments = {"x-queue-type": "quorum", "x-max-length": 10}
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare("by-amqp", durable=True, arguments=arguments)
    conn.close()
    assert call(broker, "PUT", "/api/queues/%2F/by-http",
                {"durable": True, "arguments": arguments})[0] == 201
    assert imported(broker, queues=[{"name": "by-import", "vhost": "/", "durable": True,
                                     "auto_delete": False, "arguments": arguments}])[0] == 204
    seen = {q["name"]: q for q in call(broker, "GET", "/api/queues/%2F", None)[1]}
    for name in ("by-amqp", "by-http", "by-import"):
        assert (seen[name]["type"], seen[name]["durable"], seen[name]["arguments"]) == (
            "quorum", True, arguments), name
