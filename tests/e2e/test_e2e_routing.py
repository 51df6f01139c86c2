"""Exchanges and queue features end to end with pika: headers exchanges,
exchange-to-exchange bindings, alternate and internal exchanges, declaration
rules, TTL, x-expires, length limits, dead-lettering, priorities, direct reply-to."""

from __future__ import annotations

import datetime
import time
import uuid

import pika
import pika.exceptions
import pytest

from ..support.broker import wait_until
from .test_e2e_basic import connect


def unique(prefix: str) -> str:
    """A queue or exchange name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def channel(broker):
    conn = connect(broker)
    yield conn.channel()
    if conn.is_open:
        conn.close()


def get_bodies(ch, queue: str, expected: int | None = None, timeout: float = 5.0) -> list[bytes]:
    """Everything in `queue` (auto-ack); with `expected`, wait until that many came."""
    bodies = []

    def take() -> bool:
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        return expected is None or len(bodies) >= expected

    wait_until(take, timeout=timeout)
    return bodies


def get_one(ch, queue: str, timeout: float = 5.0, auto_ack: bool = True):
    """The next message of `queue` (method, properties, body), waiting for it."""
    found = []

    def take() -> bool:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            found.append((method, props, body))
        return bool(found)

    wait_until(take, timeout=timeout)
    return found[0]


def declare_bound(ch, exchange: str, routing_key: str = "", arguments=None, **queue_args) -> str:
    queue = ch.queue_declare(unique("q"), **queue_args).method.queue
    ch.queue_bind(queue, exchange, routing_key, arguments=arguments)
    return queue


# -- headers exchanges ----------------------------------------------------------


@pytest.mark.parametrize("exchange", ["amq.headers", "amq.match"])
def test_headers_exchange_all_and_any(channel, exchange):
    ch = channel
    q_all = declare_bound(ch, exchange, arguments={"x-match": "all", "format": "pdf",
                                                   "type": "report"})
    q_any = declare_bound(ch, exchange, arguments={"x-match": "any", "format": "pdf",
                                                   "type": "report"})
    q_default = declare_bound(ch, exchange, arguments={"format": "zip"})  # all by default
    publish = lambda headers, body: ch.basic_publish(  # noqa: E731
        exchange, "ignored", body, pika.BasicProperties(headers=headers))
    publish({"format": "pdf", "type": "report"}, b"both")
    publish({"format": "pdf", "type": "log"}, b"one")
    publish({"format": "zip", "x-extra": 1}, b"zip")
    publish(None, b"none")
    assert get_bodies(ch, q_all, 1) == [b"both"]
    assert get_bodies(ch, q_any, 2) == [b"both", b"one"]
    assert get_bodies(ch, q_default, 1) == [b"zip"]


def test_headers_exchange_with_x_variants(channel):
    ch = channel
    q_plain = declare_bound(ch, "amq.headers", arguments={"x-match": "all", "x-tenant": "a"})
    q_with_x = declare_bound(ch, "amq.headers", arguments={"x-match": "all-with-x",
                                                           "x-tenant": "a"})
    q_any_x = declare_bound(ch, "amq.headers", arguments={"x-match": "any-with-x",
                                                          "x-tenant": "b", "kind": "z"})
    ch.basic_publish("amq.headers", "", b"tenant-a", pika.BasicProperties(headers={"x-tenant": "a"}))
    ch.basic_publish("amq.headers", "", b"tenant-b", pika.BasicProperties(headers={"x-tenant": "b"}))
    # 'all' ignores x- arguments: an empty set of arguments matches everything.
    assert get_bodies(ch, q_plain, 2) == [b"tenant-a", b"tenant-b"]
    assert get_bodies(ch, q_with_x, 1) == [b"tenant-a"]
    assert get_bodies(ch, q_any_x, 1) == [b"tenant-b"]


def test_headers_binding_arguments_make_distinct_bindings(channel):
    ch = channel
    queue = ch.queue_declare(unique("q")).method.queue
    ch.queue_bind(queue, "amq.headers", arguments={"k": "1"})
    ch.queue_bind(queue, "amq.headers", arguments={"k": "2"})
    ch.queue_unbind(queue, "amq.headers", arguments={"k": "1"})
    for k in ("1", "2"):
        ch.basic_publish("amq.headers", "", k.encode(), pika.BasicProperties(headers={"k": k}))
    assert get_bodies(ch, queue, 1) == [b"2"]


# -- exchange-to-exchange bindings, alternate and internal exchanges -------------


def test_exchange_to_exchange_bindings(channel):
    ch = channel
    front, back = unique("front"), unique("back")
    ch.exchange_declare(front, "topic")
    ch.exchange_declare(back, "direct")
    ch.exchange_bind(back, front, "orders.*")
    queue = declare_bound(ch, back, "orders.new")
    ch.basic_publish(front, "orders.new", b"routed")
    ch.basic_publish(front, "orders.old", b"not for the queue")
    ch.basic_publish(front, "stock.new", b"not through the binding")
    assert get_bodies(ch, queue, 1) == [b"routed"]
    ch.exchange_unbind(back, front, "orders.*")
    ch.basic_publish(front, "orders.new", b"after unbind")
    time.sleep(0.2)  # nothing must arrive; give a wrong delivery the chance to show
    assert get_bodies(ch, queue) == []


def test_exchange_binding_cycle_delivers_once(channel):
    ch = channel
    a, b = unique("a"), unique("b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    queue = declare_bound(ch, b)
    ch.basic_publish(a, "", b"once")
    assert get_bodies(ch, queue, 1) == [b"once"]
    time.sleep(0.2)
    assert get_bodies(ch, queue) == []


def test_alternate_exchange_takes_unroutable_messages(channel):
    ch = channel
    main, alternate = unique("main"), unique("ae")
    ch.exchange_declare(alternate, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": alternate})
    routed = declare_bound(ch, main, "known")
    unroutable = declare_bound(ch, alternate)
    returned = []
    ch.add_on_return_callback(lambda *args: returned.append(args))
    ch.basic_publish(main, "known", b"normal")
    ch.basic_publish(main, "unknown", b"to the alternate", mandatory=True)
    assert get_bodies(ch, routed, 1) == [b"normal"]
    assert get_bodies(ch, unroutable, 1) == [b"to the alternate"]
    ch.connection.process_data_events(0.1)
    assert returned == []  # reached a queue through the alternate: not returned


def test_internal_exchange_refuses_publishes_but_routes_bound_traffic(broker, channel):
    ch = channel
    front, inner = unique("front"), unique("inner")
    ch.exchange_declare(front, "fanout")
    ch.exchange_declare(inner, "fanout", internal=True)
    ch.exchange_bind(inner, front)
    queue = declare_bound(ch, inner)
    ch.basic_publish(front, "", b"via binding")
    assert get_bodies(ch, queue, 1) == [b"via binding"]
    ch.basic_publish(inner, "", b"direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        ch.basic_get(queue)
    assert raised.value.reply_code == 403
    assert raised.value.reply_text == (
        f"ACCESS_REFUSED - cannot publish to internal exchange '{inner}' in vhost '/'")


def test_auto_delete_exchange_goes_with_its_last_binding(channel):
    ch = channel
    name = unique("ad")
    ch.exchange_declare(name, "direct", auto_delete=True)
    queue = declare_bound(ch, name, "k1")
    ch.queue_bind(queue, name, "k2")
    ch.queue_unbind(queue, name, "k1")
    ch.exchange_declare(name, "direct", passive=True)  # one binding left: still there
    ch.queue_unbind(queue, name, "k2")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        ch.exchange_declare(name, "direct", passive=True)
    assert raised.value.reply_code == 404


# -- declaration rules ----------------------------------------------------------


def locked(queue: str) -> str:
    """RabbitMQ's text for an exclusive queue one may not use or redeclare so."""
    return (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in "
            "vhost '/'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.")


def test_unbinding_what_does_not_exist_succeeds(broker):
    """RabbitMQ 3.10 answers unbind-ok when the binding, its queue or its exchange does
    not exist; binding to something missing and purging a missing queue stay 404."""
    owner, other = connect(broker), connect(broker)
    try:
        ch = owner.channel()
        x, gone_q, gone_x = unique("x"), unique("gone-q"), unique("gone-x")
        ch.exchange_declare(x, "direct")
        queue = declare_bound(ch, x, "k")
        ch.queue_unbind(queue, x, "other-key")
        ch.queue_unbind(gone_q, x, "k")
        ch.queue_unbind(queue, gone_x, "k")
        ch.exchange_unbind(x, "amq.direct", "k")
        ch.exchange_unbind(gone_x, "amq.direct", "k")
        ch.exchange_unbind(x, gone_x, "k")
        ch.basic_publish(x, "k", b"still bound")
        assert get_bodies(ch, queue, 1) == [b"still bound"]
        ch.queue_unbind(queue, x, "k")
        ch.queue_unbind(queue, x, "k")  # a second time: nothing left, still fine
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(x, "k", b"unbound", mandatory=True)

        # Another connection's exclusive queue: unbinding nothing takes no lock.
        mine = ch.queue_declare(unique("mine"), exclusive=True).method.queue
        ch.queue_bind(mine, x, "m")
        theirs = other.channel()
        theirs.queue_unbind(mine, x, "not-bound")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            theirs.queue_unbind(mine, x, "m")
        assert (raised.value.reply_code, raised.value.reply_text) == (405, locked(mine))

        cases = [
            (lambda ch: ch.queue_bind(gone_q, x, "k"), f"no queue '{gone_q}'"),
            (lambda ch: ch.queue_bind(gone_q, gone_x, "k"), f"no exchange '{gone_x}'"),
            (lambda ch: ch.queue_bind(mine, gone_x, "k"), f"no exchange '{gone_x}'"),
            (lambda ch: ch.exchange_bind(gone_x, x, "k"), f"no exchange '{gone_x}'"),
            (lambda ch: ch.queue_purge(gone_q), f"no queue '{gone_q}'"),
        ]
        for action, text in cases:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
                action(other.channel())
            assert (raised.value.reply_code, raised.value.reply_text) == (
                404, f"NOT_FOUND - {text} in vhost '/'")
    finally:
        owner.close()
        other.close()


def test_empty_queue_name_means_the_last_declared_queue(broker, channel):
    conn = connect(broker)
    try:
        for action in (lambda ch: ch.queue_bind("", "amq.direct"),
                       lambda ch: ch.queue_unbind("", "amq.direct"),
                       lambda ch: ch.queue_purge(""),
                       lambda ch: ch.queue_delete("")):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
                action(conn.channel())  # a new channel has declared no queue
            assert (raised.value.reply_code, raised.value.reply_text) == (
                404, "NOT_FOUND - no previously declared queue")
    finally:
        conn.close()
    ch = channel
    x = unique("x")
    ch.exchange_declare(x, "direct")
    queue = ch.queue_declare(unique("last")).method.queue
    ch.queue_bind("", x, routing_key="")  # queue and routing key: the last declared queue
    ch.basic_publish(x, queue, b"by name")
    assert get_bodies(ch, queue, 1) == [b"by name"]
    ch.queue_unbind("", x, routing_key="")
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, queue, b"unbound", mandatory=True)


def test_inequivalent_and_invalid_queue_arguments(broker):
    conn = connect(broker)
    name = unique("args")
    try:
        ch = conn.channel()
        ch.queue_declare(name, arguments={"x-message-ttl": 1000})
        ch.queue_declare(name, arguments={"x-message-ttl": 1000})  # same: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.queue_declare(name, arguments={"x-message-ttl": 2000})
        assert raised.value.reply_code == 406
        assert raised.value.reply_text == (
            f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{name}' in "
            "vhost '/': received the value '2000' of type 'signedint' but current is the "
            "value '1000' of type 'signedint'")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.queue_declare(name)
        assert raised.value.reply_text.endswith(
            "received none but current is the value '1000' of type 'signedint'")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.queue_declare(unique("bad"), arguments={"x-max-priority": 256})
        assert "invalid arg 'x-max-priority'" in raised.value.reply_text
        assert raised.value.reply_text.endswith("{max_value_exceeded,256}")
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.queue_declare(unique("bad"), arguments={"x-message-ttl": -5})
        assert raised.value.reply_text.endswith("{value_negative,-5}")
        ch = conn.channel()
        ch.queue_delete(name)
    finally:
        conn.close()


def test_exchange_redeclared_with_other_alternate_is_refused(channel):
    ch = channel
    name = unique("x")
    ch.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae1"})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        ch.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae2"})
    assert raised.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' in "
        "vhost '/': received the value 'ae2' of type 'longstr' but current is the value 'ae1' "
        "of type 'longstr'")


# -- TTL and expiry ---------------------------------------------------------------


def test_queue_ttl_expires_messages_before_delivery(channel):
    ch = channel
    queue = ch.queue_declare(unique("ttl"), arguments={"x-message-ttl": 200}).method.queue
    ch.basic_publish("", queue, b"old")
    time.sleep(0.4)  # let it expire: the point of the test is the passing of time
    ch.basic_publish("", queue, b"fresh")
    assert get_bodies(ch, queue, 1) == [b"fresh"]
    wait_until(lambda: ch.queue_declare(queue, passive=True).method.message_count == 0)


def test_per_message_expiration(channel):
    ch = channel
    queue = ch.queue_declare(unique("exp")).method.queue
    ch.basic_publish("", queue, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", queue, b"long", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", queue, b"forever")
    time.sleep(0.3)
    assert get_bodies(ch, queue, 2) == [b"long", b"forever"]


def test_ttl_zero_reaches_a_waiting_consumer_only(channel):
    ch = channel
    queue = ch.queue_declare(unique("ttl0"), arguments={"x-message-ttl": 0}).method.queue
    ch.basic_publish("", queue, b"nobody waits")
    got = []
    ch.basic_consume(queue, lambda c, m, p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", queue, b"someone waits")
    wait_until(lambda: ch.connection.process_data_events(0.05) or got)
    ch.connection.process_data_events(0.2)
    assert got == [b"someone waits"]


def test_unused_queue_expires(broker):
    conn = connect(broker)
    try:
        ch = conn.channel()
        queue = ch.queue_declare(unique("exp"), arguments={"x-expires": 300}).method.queue
        ch.basic_publish("", queue, b"gone with the queue")

        def gone() -> bool:
            probe = conn.channel()
            try:
                probe.queue_declare(queue, passive=True)
                probe.close()
                return False
            except pika.exceptions.ChannelClosedByBroker as error:
                return error.reply_code == 404

        # a passive declare counts as use (as in RabbitMQ): look less often than 300 ms
        wait_until(gone, timeout=5, interval=0.6)
    finally:
        conn.close()


# -- length limits ----------------------------------------------------------------


def test_max_length_drops_from_the_head(channel):
    ch = channel
    queue = ch.queue_declare(unique("max"), arguments={"x-max-length": 3}).method.queue
    for i in range(6):
        ch.basic_publish("", queue, str(i).encode())
    assert get_bodies(ch, queue, 3) == [b"3", b"4", b"5"]


def test_max_length_bytes(channel):
    ch = channel
    queue = ch.queue_declare(unique("maxb"), arguments={"x-max-length-bytes": 10}).method.queue
    for body in (b"aaaa", b"bbbb", b"cccc"):
        ch.basic_publish("", queue, body)
    assert get_bodies(ch, queue, 2) == [b"bbbb", b"cccc"]


def test_reject_publish_nacks_confirmed_publishers(channel):
    ch = channel
    queue = ch.queue_declare(unique("rej"), arguments={"x-max-length": 2,
                                                       "x-overflow": "reject-publish"}
                             ).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"1")
    ch.basic_publish("", queue, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", queue, b"3")
    assert get_bodies(ch, queue, 2) == [b"1", b"2"]
    ch.basic_publish("", queue, b"4")  # room again
    assert get_bodies(ch, queue, 1) == [b"4"]


# -- dead-lettering ---------------------------------------------------------------


def test_rejected_message_is_dead_lettered_with_x_death(channel):
    ch = channel
    dlx = unique("dlx")
    ch.exchange_declare(dlx, "direct")
    dead = declare_bound(ch, dlx, "dead")
    work = ch.queue_declare(unique("work"), arguments={
        "x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"}).method.queue
    ch.basic_publish("", work, b"bad", pika.BasicProperties(headers={"app": "x"}))
    method, _props, _body = get_one_manual(ch, work)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _method, props, body = get_one(ch, dead)
    assert body == b"bad"
    headers = props.headers
    assert headers["app"] == "x"
    [death] = headers["x-death"]
    assert death["queue"] == work
    assert death["reason"] == "rejected"
    assert death["count"] == 1
    assert death["exchange"] == ""
    assert death["routing-keys"] == [work]
    assert _as_utc(death["time"]) >= before - datetime.timedelta(seconds=2)
    assert headers["x-first-death-queue"] == work
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-exchange"] == ""


def test_expired_and_overflowed_messages_are_dead_lettered(channel):
    ch = channel
    dlx = unique("dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = declare_bound(ch, dlx)
    expiring = ch.queue_declare(unique("ttl"), arguments={
        "x-dead-letter-exchange": dlx, "x-message-ttl": 50}).method.queue
    limited = ch.queue_declare(unique("max"), arguments={
        "x-dead-letter-exchange": dlx, "x-max-length": 1}).method.queue
    ch.basic_publish("", expiring, b"expired", pika.BasicProperties(expiration="10000"))
    ch.basic_publish("", limited, b"dropped")
    ch.basic_publish("", limited, b"kept")
    reasons = {}
    for _ in range(2):
        _m, props, body = get_one(ch, dead)
        reasons[body] = props.headers["x-death"][0]["reason"]
        if body == b"expired":
            # the copy does not expire again: its expiration moved into x-death
            assert props.expiration is None
            assert props.headers["x-death"][0]["original-expiration"] == "10000"
    assert reasons == {b"expired": "expired", b"dropped": "maxlen"}
    assert get_bodies(ch, limited, 1) == [b"kept"]


def test_dead_letter_cycle_without_rejection_is_dropped(channel):
    ch = channel
    a, b = unique("cyc-a"), unique("cyc-b")
    # a expires into b, b expires back into a: no consumer ever sees it
    ch.queue_declare(a, arguments={"x-message-ttl": 30, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": b})
    ch.queue_declare(b, arguments={"x-message-ttl": 30, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"round and round")

    def empty_for_a_while() -> bool:
        counts = [ch.queue_declare(q, passive=True).method.message_count for q in (a, b)]
        return counts == [0, 0]

    wait_until(empty_for_a_while, timeout=5)
    time.sleep(0.3)  # were it looping, it would be back in one of them by now
    assert [ch.queue_declare(q, passive=True).method.message_count for q in (a, b)] == [0, 0]


def test_delayed_retry_with_dlx_and_ttl(channel):
    """The common retry pattern: a consumer rejects, the message waits in a retry
    queue whose TTL dead-letters it back to the work queue."""
    ch = channel
    work, retry = unique("work"), unique("retry")
    ch.queue_declare(work, arguments={"x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": retry})
    ch.queue_declare(retry, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                       "x-dead-letter-routing-key": work})
    ch.basic_publish("", work, b"job")
    seen = []
    for attempt in range(3):
        method, props, body = get_one_manual(ch, work)
        assert body == b"job"
        deaths = {(d["queue"], d["reason"]): d["count"] for d in (props.headers or {}).get(
            "x-death", [])}
        seen.append(deaths)
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert seen[0] == {}
    assert seen[1] == {(work, "rejected"): 1, (retry, "expired"): 1}
    assert seen[2] == {(work, "rejected"): 2, (retry, "expired"): 2}


def get_one_manual(ch, queue: str, timeout: float = 5.0):
    return get_one(ch, queue, timeout, auto_ack=False)


def _as_utc(value: datetime.datetime) -> datetime.datetime:
    return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)


# -- priorities -------------------------------------------------------------------


def test_priority_queue_delivers_highest_first(channel):
    ch = channel
    queue = ch.queue_declare(unique("prio"), arguments={"x-max-priority": 5}).method.queue
    for body, priority in [(b"low", 1), (b"none", None), (b"high", 5), (b"above-max", 9),
                           (b"mid", 3), (b"high-2", 5)]:
        ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    # priorities above the maximum count as the maximum; same priority keeps order
    assert get_bodies(ch, queue, 6) == [b"high", b"above-max", b"high-2", b"mid", b"low",
                                        b"none"]


def test_requeued_message_keeps_its_priority_place(channel):
    ch = channel
    queue = ch.queue_declare(unique("prio"), arguments={"x-max-priority": 2}).method.queue
    for body, priority in [(b"p2", 2), (b"p1", 1), (b"p0", 0)]:
        ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    method, _p, body = get_one_manual(ch, queue)
    assert body == b"p2"
    method2, _p, body2 = get_one_manual(ch, queue)
    assert body2 == b"p1"
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch.basic_nack(method2.delivery_tag, requeue=True)
    assert get_bodies(ch, queue, 3) == [b"p2", b"p1", b"p0"]


def test_durable_priority_and_ttl_queue_survives_restart(fresh_broker):
    broker = fresh_broker.start()
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("prio-durable", durable=True, arguments={"x-max-priority": 3})
    ch.queue_declare("ttl-durable", durable=True, arguments={"x-message-ttl": 60000})
    ch.confirm_delivery()
    for body, priority in [(b"a", 0), (b"b", 3), (b"c", 1)]:
        ch.basic_publish("", "prio-durable", body,
                         pika.BasicProperties(priority=priority, delivery_mode=2))
    ch.basic_publish("", "ttl-durable", b"short", pika.BasicProperties(expiration="300",
                                                                        delivery_mode=2))
    ch.basic_publish("", "ttl-durable", b"long", pika.BasicProperties(delivery_mode=2))
    conn.close()
    broker.stop()
    broker.start()
    conn = connect(broker)
    ch = conn.channel()
    assert get_bodies(ch, "prio-durable", 3) == [b"b", b"c", b"a"]
    time.sleep(0.4)  # past the 300 ms expiration, which the store kept
    assert get_bodies(ch, "ttl-durable", 1) == [b"long"]
    conn.close()


# -- direct reply-to --------------------------------------------------------------


def test_direct_reply_to_rpc(broker):
    server_conn, client_conn = connect(broker), connect(broker)
    try:
        server = server_conn.channel()
        service = server.queue_declare(unique("rpc")).method.queue
        client = client_conn.channel()
        replies = []
        client.basic_consume("amq.rabbitmq.reply-to",
                             lambda c, m, props, body: replies.append((props, body)),
                             auto_ack=True)
        client.basic_publish("", service, b"2+2", pika.BasicProperties(
            reply_to="amq.rabbitmq.reply-to", correlation_id="c1"))
        method, props, body = get_one(server, service)
        assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
        server.basic_publish("", props.reply_to, b"4",
                             pika.BasicProperties(correlation_id=props.correlation_id))
        wait_until(lambda: client_conn.process_data_events(0.05) or replies)
        [(reply_props, reply_body)] = replies
        assert reply_body == b"4" and reply_props.correlation_id == "c1"
        # the address is there while its channel consumes (RabbitMQ: one consumer),
        # and so is the pseudo-queue, for clients that check for the feature
        for name in (props.reply_to, "amq.rabbitmq.reply-to"):
            ok = server.queue_declare(name, passive=True).method
            assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 1)
        # once the requester is gone, a reply to it is simply dropped
        client_conn.close()
        server.basic_publish("", props.reply_to, b"late")
        server.queue_declare(service, passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            server.queue_declare(props.reply_to, passive=True)
        assert closed.value.reply_text == f"NOT_FOUND - no queue '{props.reply_to}' in vhost '/'"
    finally:
        for conn in (server_conn, client_conn):
            if conn.is_open:
                conn.close()


# -- RPC as the client libraries teach it ---------------------------------------------


def test_pika_tutorial_fibonacci_rpc(broker):
    """RabbitMQ's RPC tutorial: a server on its own queue and thread, a client with an
    exclusive callback queue matching replies by correlation id."""
    import threading

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    service = unique("rpc_queue")
    server_conn = connect(broker)
    server = server_conn.channel()
    server.queue_declare(service)

    def on_request(ch, method, props, body) -> None:
        ch.basic_publish("", props.reply_to, str(fib(int(body))).encode(),
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    server.basic_qos(prefetch_count=1)
    server.basic_consume(service, on_request)
    serving = threading.Thread(target=server.start_consuming)
    serving.start()
    client_conn = connect(broker)
    try:
        client = client_conn.channel()
        callback_queue = client.queue_declare("", exclusive=True).method.queue
        responses = {}

        def on_response(ch, method, props, body) -> None:
            responses[props.correlation_id] = int(body)

        client.basic_consume(callback_queue, on_response, auto_ack=True)
        for n in (0, 1, 10, 20):
            corr_id = str(uuid.uuid4())
            client.basic_publish("", service, str(n).encode(), pika.BasicProperties(
                reply_to=callback_queue, correlation_id=corr_id))
            wait_until(lambda: client_conn.process_data_events(0.02) or corr_id in responses)
            assert responses[corr_id] == fib(n)
    finally:
        server_conn.add_callback_threadsafe(server.stop_consuming)
        serving.join(10)
        server_conn.close()
        client_conn.close()


def test_aio_pika_rpc_pattern(broker):
    """aio_pika.patterns.RPC end to end. Its close cancels the reply consumer, which
    deletes the auto-delete reply queue, and then unbinds that queue: the unbind must
    succeed, as on RabbitMQ, for close not to raise."""
    import asyncio

    import aio_pika
    from aio_pika.patterns import RPC

    async def scenario() -> None:
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            rpc = await RPC.create(ch)

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            method = unique("multiply")
            await rpc.register(method, multiply, auto_delete=True)
            assert await rpc.call(method, kwargs={"x": 6, "y": 7}) == 42
            with pytest.raises(aio_pika.exceptions.MessageProcessError, match="returned"):
                await rpc.call(unique("no-such-method"), kwargs={})
            await rpc.close()
            assert not ch.is_closed
            # the channel still works after the unbind of a queue that is gone
            await ch.declare_queue(unique("after"), auto_delete=True)

    asyncio.run(asyncio.wait_for(scenario(), 60))


# -- fan-out -----------------------------------------------------------------------


def test_fanout_to_a_hundred_queues_on_every_shard(channel):
    ch = channel
    exchange = unique("wide")
    ch.exchange_declare(exchange, "fanout")
    queues = [declare_bound(ch, exchange) for _ in range(100)]
    ch.confirm_delivery()
    ch.basic_publish(exchange, "", b"to all")
    for queue in queues:
        assert get_bodies(ch, queue, 1) == [b"to all"]


# -- the same features through aio-pika ----------------------------------------------


def test_aio_pika_headers_dead_letter_and_direct_reply_to(broker):
    import asyncio

    import aio_pika

    async def scenario() -> None:
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            headers_x = await ch.declare_exchange(unique("hx"), aio_pika.ExchangeType.HEADERS)
            dlx = await ch.declare_exchange(unique("dlx"), aio_pika.ExchangeType.FANOUT)
            dead = await ch.declare_queue(unique("dead"))
            await dead.bind(dlx)
            work = await ch.declare_queue(unique("work"),
                                          arguments={"x-dead-letter-exchange": dlx.name})
            await work.bind(headers_x, arguments={"x-match": "any", "kind": "job"})
            await headers_x.publish(aio_pika.Message(b"job", headers={"kind": "job"}), "")
            message = await _get(work)
            await message.reject(requeue=False)
            dead_message = await _get(dead)
            assert dead_message.body == b"job"
            assert dead_message.headers["x-death"][0]["reason"] == "rejected"
            await dead_message.ack()

            # direct reply-to, as aio-pika's RPC pattern uses it
            service = await ch.declare_queue(unique("svc"))

            async def serve(request: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with request.process():
                    await ch.default_exchange.publish(
                        aio_pika.Message(request.body.upper(),
                                         correlation_id=request.correlation_id),
                        request.reply_to)

            await service.consume(serve)
            replies = await ch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            got: asyncio.Future = asyncio.get_running_loop().create_future()

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                if not got.done():
                    got.set_result(message)

            await replies.consume(on_reply, no_ack=True)
            await ch.default_exchange.publish(
                aio_pika.Message(b"ping", correlation_id="7", reply_to="amq.rabbitmq.reply-to"),
                service.name)
            reply = await asyncio.wait_for(got, 10)
            assert (reply.body, reply.correlation_id) == (b"PING", "7")

    async def _get(queue):
        for _ in range(500):
            message = await queue.get(fail=False)
            if message is not None:
                return message
            await asyncio.sleep(0.01)
        raise AssertionError(f"nothing arrived in {queue.name}")

    asyncio.run(scenario())


def test_single_active_consumer(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = ch.queue_declare(unique("sac"), arguments={"x-single-active-consumer": True}
                             ).method.queue
    got = []
    ch.basic_consume(queue, lambda c, m, p, body: got.append(("first", body)), auto_ack=True,
                     consumer_tag="first")
    ch.basic_consume(queue, lambda c, m, p, body: got.append(("second", body)), auto_ack=True,
                     consumer_tag="second")
    for i in range(4):
        ch.basic_publish("", queue, b"%d" % i)
    wait_until(lambda: (conn.process_data_events(0.02), len(got) == 4)[1])
    assert {who for who, _ in got} == {"first"}
    ch.basic_cancel("first")
    ch.basic_publish("", queue, b"after")
    wait_until(lambda: (conn.process_data_events(0.02), len(got) == 5)[1])
    assert got[-1] == ("second", b"after")
    conn.close()


def test_cc_and_bcc_headers_add_routing_keys(channel):
    ch = channel
    x = unique("sel")
    ch.exchange_declare(x, "direct")
    main, cc, bcc = (declare_bound(ch, x, key) for key in ("main", "copy", "blind"))
    ch.basic_publish(x, "main", b"m", pika.BasicProperties(
        headers={"CC": ["copy"], "BCC": ["blind"], "app": 1}))
    for queue in (main, cc, bcc):
        _method, props, body = get_one(ch, queue)
        assert body == b"m"
        assert props.headers["CC"] == ["copy"] and props.headers["app"] == 1
        assert "BCC" not in props.headers  # removed before delivery, as in RabbitMQ
