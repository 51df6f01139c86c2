"""A channel's consumers: basic.qos and the credit it deals, basic.consume and
basic.cancel, deliveries and their tags, consumer timeouts, direct reply-to, and
basic.get and the settling of deliveries (ack, nack, reject, recover)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Callable

from warren.shards import records as r
from warren.shards.batches import SIDE_BODY_MIN

from ..amqp import frames, hotpath, spec
from ..amqp import methods as m
from ..amqp.properties import (
    PropertiesError,
    decode_properties,
    encode_properties,
)
from ..errors import AMQPError, queue_name
from ..values import QueueMeta, server_generated_name
from . import prefetch, replyto
from .assembly import BASIC_CLASS
from .state import ChannelState, ConsumerState
from .unacked import Delivery

if TYPE_CHECKING:
    from .ports import Broker

# Link credit of a consumer outside a channel-wide limit: how many deliveries may
# be on their way between its shard and the socket. Credit comes back as
# deliveries are written to the socket, so a slow reader stops its shard.
FLOW_WINDOW = 2000
# Window credit goes back in chunks, once the shard's share is down to this (as
# RabbitMQ's credit_flow grants after half its initial credit): a grant at every
# socket write would wake the shard for it at every loop turn.
GRANT_BELOW = FLOW_WINDOW // 2


class Consuming:
    """Gets the channel's state, the broker port and the channel's `request`
    (send a request to a shard, park the channel until the answer ran). What a
    delivery or an ack touches is bound here once."""

    __slots__ = ("state", "broker", "request", "conn", "number", "id", "totals", "unacked",
                 "by_holder", "consumers")

    def __init__(self, state: ChannelState, broker: Broker, request: Callable):
        self.state = state
        self.broker = broker
        self.request = request
        self.conn = state.conn
        self.number = state.number
        self.id = state.id
        self.totals = broker.totals
        self.unacked = state.unacked
        self.by_holder = state.by_holder
        self.consumers = state.consumers

    # -- basic: consuming ------------------------------------------------------

    def basic_qos(self, method: m.BasicQos) -> None:
        if method.prefetch_size:
            raise AMQPError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self._set_channel_prefetch(method.prefetch_count)
        else:
            self.state.consumer_prefetch = method.prefetch_count
        self.state.send(m.BasicQosOk())

    def _limited(self, consumer: ConsumerState) -> bool:
        return bool(self.state.channel_prefetch) and not consumer.no_ack

    def _set_channel_prefetch(self, limit: int) -> None:
        """Re-deal credit under the new limit; deliveries already on their way may
        briefly leave more unacked than it, as in RabbitMQ."""
        was_limited = bool(self.state.channel_prefetch)
        self.state.channel_prefetch = limit
        for consumer in self.consumers.values():
            if consumer.no_ack:
                continue
            if limit:
                consumer.credit = 0
            elif was_limited:
                consumer.credit = FLOW_WINDOW
            else:
                continue
            consumer.owed_credit = 0
            consumer.link.send(r.Grant(consumer.meta.qid, consumer.holder, consumer.credit,
                                       reset=True))
        self._deal_credit()

    def _deal_credit(self) -> None:
        """Hand the channel's free credit to its limited consumers, least-served first."""
        if not self.state.channel_prefetch:
            return
        limited = [c for c in self.consumers.values() if not c.no_ack]
        if not limited:
            return
        grants = prefetch.deal(self.state.channel_prefetch, self.state.consumer_unacked,
                               [c.credit for c in limited], [c.room() for c in limited])
        for consumer, credit in zip(limited, grants):
            if credit:
                consumer.credit += credit
                consumer.link.send(r.Grant(consumer.meta.qid, consumer.holder, credit))

    def basic_consume(self, method: m.BasicConsume) -> None:
        if method.queue == replyto.REPLY_QUEUE:
            return self._consume_replies(method)
        meta = self.state.queue_named(method.queue)
        self.state.allow("read", "queue", meta.spec.name)
        stream_from, stream_at = "", 0
        if meta.spec.queue_type == "stream":
            stream_from, stream_at = self._stream_start(method, meta)
        tag = method.consumer_tag or server_generated_name("amq.ctag-")
        if tag in self.consumers or tag == self.state.reply_consumer:
            raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        priority = method.arguments.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            "invalid arg 'x-priority' for "
                            f"{queue_name(meta.spec.vhost, meta.spec.name)}")
        timeout_ms = self._consumer_timeout(method, meta)
        holder = self.broker.new_id()
        link = self.state.link(meta)
        consumer = ConsumerState(tag, holder, meta, link, method.no_ack, method.exclusive,
                                 self.state.consumer_prefetch, timeout_ms, method.arguments)
        consumer.credit = 0 if self._limited(consumer) else FLOW_WINDOW
        self.consumers[tag] = consumer
        self.by_holder[holder] = consumer
        self.state.holder_ids.add(holder)
        self.broker.add_holder(holder, self.state)

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                self._forget_consumer(consumer)
                raise self.state.refusal(reply.refused, meta)
            self.state.reply(m.BasicConsumeOk(consumer_tag=tag), method.nowait)

        self.request(link, lambda req: r.Consume(
            req, meta.qid, holder, self.id, tag, method.no_ack, method.exclusive,
            self.state.consumer_prefetch, consumer.credit, priority, timeout_ms, stream_from,
            stream_at), answered)
        self._deal_credit()

    def _stream_start(self, method: m.BasicConsume, meta: QueueMeta) -> tuple[str, int]:
        """A stream consumer's refusals (RabbitMQ's, in its order) and where it
        starts: Consume's stream_from and stream_at."""
        what = queue_name(meta.spec.vhost, meta.spec.name)
        if method.no_ack:
            raise AMQPError(spec.NOT_IMPLEMENTED,
                            f"automatic acknowledgement not supported by stream queues {what}")
        if not self.state.consumer_prefetch:
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"consumer prefetch count is not set for '{what}'")
        return stream_start(method.arguments.get("x-stream-offset", "next"))

    def _consumer_timeout(self, method: m.BasicConsume, meta: QueueMeta) -> int:
        """The consumer timeout in ms (quorum queues and streams; classic ones have none):
        the consumer's x-consumer-timeout, else min(queue argument, policy), else
        the broker's consumer_timeout (RabbitMQ 4.3's precedence)."""
        own = method.arguments.get("x-consumer-timeout")
        if own is not None and (isinstance(own, bool) or not isinstance(own, int) or own <= 0):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"invalid arg 'x-consumer-timeout' for "
                            f"{queue_name(meta.spec.vhost, meta.spec.name)}")
        if meta.spec.queue_type not in ("quorum", "stream") or method.no_ack:
            return 0
        if own is not None:
            return own
        return meta.effective.get("x-consumer-timeout") or self.broker.config.consumer_timeout

    def consumer_timed_out(self, event: r.ConsumerTimedOut) -> None:
        """RabbitMQ 4.3: cancel just that consumer for clients that understand
        basic.cancel; close the channel for the others."""
        consumer = self.by_holder.get(event.holder)
        if consumer is None or self.state.closing or self.state.closed:
            return
        consumer.timed_out = True
        if self.conn.capabilities.get("consumer_cancel_notify"):
            # Its deliveries stay unacked here: acking them later is no error.
            seqs = set(event.seqs)
            tags = self.unacked.tags_of(consumer.holder, seqs)
            if tags:
                self.state.timed_out[consumer.tag] = (consumer, tags)
            self._forget_consumer(consumer)
            consumer.link.send(r.Cancel(0, consumer.meta.qid, consumer.holder))
            self.state.send(m.BasicCancel(consumer_tag=consumer.tag, nowait=True))
        else:
            self.conn.close_channel_with_error(self.state, AMQPError(
                spec.PRECONDITION_FAILED,
                f"delivery acknowledgement on channel {self.number} timed out. Timeout value "
                f"used: {event.timeout_ms} ms. This timeout value can be configured, see "
                "consumers doc guide to learn more"))

    def _settled_timed_out(self, tags: set[int]) -> None:
        for consumer_tag, (_consumer, pending) in list(self.state.timed_out.items()):
            pending -= tags
            if not pending:
                del self.state.timed_out[consumer_tag]

    def _consume_replies(self, method: m.BasicConsume) -> None:
        if not method.no_ack:
            raise AMQPError(spec.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.state.reply_consumer is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "reply consumer already set")
        tag = method.consumer_tag or server_generated_name("amq.ctag-")
        if tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        self.state.reply_consumer = tag
        self.state.reply_key, self.state.reply_address = replyto.new_address(self.broker.index,
                                                                               self.broker.node_number)
        self.broker.add_reply_channel(self.state.reply_key, self.state)
        self.state.reply(m.BasicConsumeOk(consumer_tag=tag), method.nowait)

    def stop_replies(self) -> None:
        if self.state.reply_consumer is not None:
            self.broker.drop_reply_channel(self.state.reply_key)
            self.state.reply_consumer = None

    def basic_cancel(self, method: m.BasicCancel) -> None:
        if method.consumer_tag == self.state.reply_consumer and self.state.reply_consumer is not None:
            self.stop_replies()
            return self.state.reply(m.BasicCancelOk(consumer_tag=method.consumer_tag), method.nowait)
        consumer = self.consumers.get(method.consumer_tag)
        if consumer is None:
            # Not an error: the broker may have cancelled it already (queue deleted).
            return self.state.reply(m.BasicCancelOk(consumer_tag=method.consumer_tag), method.nowait)

        def answered(reply: r.Reply) -> None:
            self._forget_consumer(consumer)
            self.state.reply(m.BasicCancelOk(consumer_tag=consumer.tag), method.nowait)

        self.request(consumer.link, lambda req: r.Cancel(req, consumer.meta.qid, consumer.holder),
                      answered)

    def _forget_consumer(self, consumer: ConsumerState) -> None:
        self.consumers.pop(consumer.tag, None)
        self.by_holder.pop(consumer.holder, None)
        self.broker.forget_holder(consumer.holder)
        self.conn.owed_grants.discard(consumer)
        self._deal_credit()  # a limited consumer's credit went with it

    def consumer_cancelled_by_broker(self, holder: int) -> None:
        consumer = self.by_holder.get(holder)
        if consumer is None or self.state.closing:
            return
        self._forget_consumer(consumer)
        if self.conn.capabilities.get("consumer_cancel_notify"):
            self.state.send(m.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    def deliver(self, link, event: r.Deliver) -> None:
        consumer = self.by_holder.get(event.holder)
        state = self.state
        if consumer is None or state.closing:
            return  # cancelled meanwhile; the shard requeues what this holder kept
        tag = state.next_tag
        state.next_tag += 1
        totals = self.totals
        if event.redelivered:
            totals.redelivered += 1
        consumer.credit -= 1
        if consumer.no_ack:
            totals.consume_auto_ack += 1
        else:
            totals.consume_manual_ack += 1
            self.unacked.add(tag, Delivery(link, event.qid, event.holder, event.seq))
            state.consumer_unacked += 1
            consumer.unacked += 1
        properties = event.properties
        if event.delivery_count:
            properties = _with_delivery_count(properties, event.delivery_count)
        conn = self.conn
        if len(event.body) < SIDE_BODY_MIN:  # the frames packed in one join
            data = hotpath.deliver_frames(
                self.number, consumer.tag_shortstr, tag, event.redelivered, event.exchange,
                event.routing_key, properties, event.body, conn.frame_max)
            if state.flow_active:
                conn.send(data)
            else:
                state.held_deliveries.append(data)
        else:  # the body goes out uncopied, by writev
            parts = frames.content_parts(
                self.number, hotpath.deliver_payload(consumer.tag_shortstr, tag,
                                                     event.redelivered, event.exchange,
                                                     event.routing_key),
                BASIC_CLASS, properties, event.body, conn.frame_max)
            if state.flow_active:
                conn.send_uncopied(parts)
            else:
                state.held_deliveries.append(b"".join(parts))
        if consumer.no_ack or not state.channel_prefetch:  # not limited: window mode
            consumer.owed_credit += 1
            if consumer.credit <= GRANT_BELOW:
                conn.owed_grants.add(consumer)
                conn.schedule_flush()

    def return_credit(self, consumer: ConsumerState) -> None:
        """Window mode: give back the credit of deliveries that left through the socket."""
        if consumer.owed_credit and self.state.flow_active and consumer.holder in self.by_holder:
            consumer.link.send(r.Grant(consumer.meta.qid, consumer.holder, consumer.owed_credit))
            consumer.credit += consumer.owed_credit
            consumer.owed_credit = 0

    # -- basic: get and settle -------------------------------------------------

    def basic_get(self, method: m.BasicGet) -> None:
        meta = self.state.queue_named(method.queue)
        self.state.allow("read", "queue", meta.spec.name)
        if meta.spec.queue_type == "stream":
            raise AMQPError(spec.NOT_IMPLEMENTED, "basic.get not supported by stream queues "
                            f"{queue_name(meta.spec.vhost, meta.spec.name)}")
        link = self.state.link(meta)

        def answered(reply: r.GetReply) -> None:
            if reply.refused:
                raise self.state.refusal(reply.refused, meta)
            totals = self.totals
            if reply.seq == 0:
                totals.get_empty += 1
                return self.state.send(m.BasicGetEmpty())
            if method.no_ack:
                totals.get_auto_ack += 1
            else:
                totals.get_manual_ack += 1
            if reply.redelivered:
                totals.redelivered += 1
            tag = self.state.next_tag
            self.state.next_tag += 1
            if not method.no_ack:
                self.unacked.add(tag, Delivery(link, meta.qid, self.id, reply.seq))
            self.conn.send(frames.content_frames(
                self.number,
                m.encode_method(m.BasicGetOk(delivery_tag=tag, redelivered=reply.redelivered,
                                             exchange=reply.exchange,
                                             routing_key=reply.routing_key,
                                             message_count=reply.message_count)),
                BASIC_CLASS, _with_delivery_count(reply.properties, reply.delivery_count)
                if reply.delivery_count else reply.properties, reply.body, self.conn.frame_max))

        self.request(link, lambda req: r.Get(req, meta.qid, self.id, method.no_ack), answered)

    def _settle(self, taken: list[tuple[int, Delivery]], outcome: int) -> None:
        if self.state.tx is not None:
            self.state.tx.settle(taken, outcome)
        else:
            self.settle_now(taken, outcome)

    def settle_now(self, taken: list[tuple[int, Delivery]], outcome: int) -> None:
        if self.state.timed_out:
            self._settled_timed_out({tag for tag, _ in taken})
        if len(taken) == 1:
            self._settle_one(taken[0][1], outcome)
            return
        groups: dict[tuple, list[int]] = {}
        for _tag, delivery in taken:
            groups.setdefault((delivery.link, delivery.qid, delivery.holder), []).append(
                delivery.seq)
            if delivery.holder != self.id:
                self.state.consumer_unacked -= 1
                consumer = self.by_holder.get(delivery.holder)
                if consumer is not None:
                    consumer.unacked -= 1
        for (link, qid, holder), seqs in groups.items():
            link.send(r.Settle(qid, holder, seqs, outcome))
        self._deal_credit()

    def _settle_one(self, delivery: Delivery, outcome: int) -> None:
        """One delivery settled, outside a transaction: the common case, without
        grouping (its timed-out state, if any, already dealt with)."""
        state = self.state
        consumer = None
        if delivery.holder != self.id:
            state.consumer_unacked -= 1
            consumer = self.by_holder.get(delivery.holder)
            if consumer is not None:
                consumer.unacked -= 1
        link = delivery.link
        link.send(r.Settle(delivery.qid, delivery.holder, [delivery.seq], outcome),
                  lazy=outcome == r.SETTLE_ACK and not state.channel_prefetch
                  and _room_left(consumer, link.lazy_acks))
        if state.channel_prefetch:
            self._deal_credit()

    def basic_ack(self, method: m.BasicAck) -> None:
        self.ack(method.delivery_tag, method.multiple)

    def ack(self, tag: int, multiple: bool) -> None:
        state = self.state
        if not multiple and state.tx is None and not state.timed_out:
            # one delivery, the common case: without the list _settle takes
            delivery = self.unacked.pop(tag)
            if delivery is not None:
                self.totals.acknowledged += 1
                self._settle_one(delivery, r.SETTLE_ACK)
                return
        taken = self.unacked.take(tag, multiple)
        self.totals.acknowledged += len(taken)
        self._settle(taken, r.SETTLE_ACK)

    def basic_nack(self, method: m.BasicNack) -> None:
        # A nack with requeue is not a failed delivery (RabbitMQ 4.3 counting).
        outcome = r.SETTLE_RETURN if method.requeue else r.SETTLE_DISCARD
        taken = self.unacked.take(method.delivery_tag, method.multiple)
        self._refuse_stream_settle(taken)
        self._settle(taken, outcome)

    def basic_reject(self, method: m.BasicReject) -> None:
        outcome = r.SETTLE_REQUEUE if method.requeue else r.SETTLE_DISCARD
        taken = self.unacked.take(method.delivery_tag, False)
        self._refuse_stream_settle(taken)
        self._settle(taken, outcome)

    def _refuse_stream_settle(self, taken: list[tuple[int, Delivery]]) -> None:
        """A stream removes nothing, so it takes no nack or reject (RabbitMQ's 540)."""
        for _tag, delivery in taken:
            consumer = self.by_holder.get(delivery.holder)
            if consumer is not None and consumer.meta.spec.queue_type == "stream":
                raise AMQPError(spec.NOT_IMPLEMENTED,
                                "basic.nack and basic.reject not supported by stream queues "
                                f"{queue_name(consumer.meta.spec.vhost, consumer.meta.spec.name)}")

    def basic_recover(self, method) -> None:
        if not method.requeue:
            raise AMQPError(spec.NOT_IMPLEMENTED, "requeue=false")
        if any(c.meta.spec.queue_type == "stream" for c in self.consumers.values()):
            raise internal_error()  # RabbitMQ's stream queue fails it so
        self.settle_now(self.unacked.take_all(), r.SETTLE_REQUEUE)
        if type(method) is m.BasicRecover:
            self.state.send(m.BasicRecoverOk())


def _room_left(consumer: ConsumerState | None, unsent: int) -> bool:
    """May an ack of this consumer's wait for other records to its shard? Yes while
    the shard, not knowing of it and of the `unsent` acks before it, still has
    half the consumer's prefetch to deliver into: a consumer that keeps up never
    waits for its acks to reach the shard. (A basic.get's ack: yes.)"""
    if consumer is None or not consumer.prefetch:
        return True
    return consumer.unacked + unsent + 1 <= consumer.prefetch // 2


def _with_delivery_count(properties: bytes, count: int) -> bytes:
    """The properties with the x-delivery-count header quorum queues add."""
    try:
        props = decode_properties(properties)
    except PropertiesError:
        return properties
    props.headers = {**(props.headers or {}), "x-delivery-count": count}
    return encode_properties(props)


def internal_error() -> AMQPError:
    """RabbitMQ's answer where its channel crashes: 541, the bare name as text."""
    error = AMQPError(spec.INTERNAL_ERROR, "")
    error.text = "INTERNAL_ERROR"
    return error


def stream_start(offset) -> tuple[str, int]:
    """Where a stream consumer's x-stream-offset starts it: ("first" | "last" |
    "next", 0), ("offset", n) or ("timestamp", ms; the argument is AMQP's
    seconds). Another value gets RabbitMQ's answer, a crashed channel's 541."""
    if isinstance(offset, bytes):
        offset = offset.decode("utf-8", "replace")
    if isinstance(offset, str) and offset in ("first", "last", "next"):
        return offset, 0
    if isinstance(offset, int) and not isinstance(offset, bool):
        return "offset", max(offset, 0)
    if isinstance(offset, datetime.datetime):
        return "timestamp", int(offset.timestamp()) * 1000
    raise internal_error()
