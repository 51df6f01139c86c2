"""One AMQP channel: frames in, commands run in order, teardown.

The channel is its state (state.ChannelState, every attribute typed there) and
three handler objects it builds, each given exactly what it uses: Declaring
(exchanges, queues, bindings), Consuming (consumers, credit, deliveries, get and
settle) and Publishing (publish, routing, confirms, transactions). They reach
the broker only through the port (ports.Broker). Each AMQP method goes to its
handler through a table built once per channel.

A method that needs a shard's answer (say queue.delete) sends a request and
parks the channel: commands that arrive meanwhile wait in a backlog and run in
order once the answer is in, so a channel's methods always take effect in the
order the client sent them. Frames are decoded and content assembled as they
arrive, never on replay: a malformed frame is the sender's connection error at
once, wherever its channel is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..amqp import frames, hotpath, spec
from ..amqp import methods as m
from ..errors import AMQPError
from ..snapshots import ChannelInfo, ConsumerInfo
from .consuming import Consuming
from .declaring import Declaring
from .publishing import Publishing
from .state import ChannelState

if TYPE_CHECKING:
    from .ports import Client, Peer

# Commands a channel keeps while it waits for a shard before its connection stops
# being read (a publisher pipelining behind a queue.declare cannot grow it without end).
BACKLOG_LIMIT = 1000

# Another gateway's channel: what changes the catalogue, gateway 0 runs (purge does not).
FORWARDED = (m.ExchangeDeclare, m.ExchangeDelete, m.ExchangeBind, m.ExchangeUnbind,
             m.QueueDeclare, m.QueueBind, m.QueueUnbind, m.QueueDelete)


class Channel(ChannelState):
    __slots__ = (
        "declaring", "consuming", "publishing", "handlers",
        # what the connection and the broker's dispatcher call, bound once here
        "handle_publish", "publish", "ack", "deliver", "return_credit",
        "consumer_timed_out", "consumer_cancelled_by_broker", "confirmed", "rejected",
        "send_confirms", "reply_outcome", "deliver_reply")

    declaring: Declaring
    consuming: Consuming
    publishing: Publishing
    handlers: dict[type, Callable]  # AMQP method class -> its handler

    def __init__(self, conn: Client, number: int):
        super().__init__(conn, number)
        broker = self.broker
        broker.add_holder(self.id, self)
        self.declaring = declaring = Declaring(self, broker, self.request)
        self.consuming = consuming = Consuming(self, broker, self.request)
        self.publishing = publishing = Publishing(self, broker, self.command,
                                                  consuming.settle_now, self.drain_backlog)
        self.handle_publish = publishing.handle_publish
        self.publish = publishing.publish
        self.ack = consuming.ack
        self.deliver = consuming.deliver
        self.return_credit = consuming.return_credit
        self.consumer_timed_out = consuming.consumer_timed_out
        self.consumer_cancelled_by_broker = consuming.consumer_cancelled_by_broker
        self.confirmed = publishing.confirmed
        self.rejected = publishing.rejected
        self.send_confirms = publishing.send_confirms
        self.reply_outcome = publishing.reply_outcome
        self.deliver_reply = publishing.deliver_reply
        self.handlers = {
            m.ChannelOpen: self._channel_open,
            m.ChannelFlow: self._channel_flow,
            m.ChannelClose: self._channel_close,
            m.ChannelCloseOk: self._channel_close_ok,
            m.AccessRequest: self._access_request,
            m.ExchangeDeclare: declaring.exchange_declare,
            m.ExchangeDelete: declaring.exchange_delete,
            m.ExchangeBind: declaring.exchange_bind,
            m.ExchangeUnbind: declaring.exchange_unbind,
            m.QueueDeclare: declaring.queue_declare,
            m.QueueBind: declaring.queue_bind,
            m.QueueUnbind: declaring.queue_unbind,
            m.QueuePurge: declaring.queue_purge,
            m.QueueDelete: declaring.queue_delete,
            m.BasicQos: consuming.basic_qos,
            m.BasicConsume: consuming.basic_consume,
            m.BasicCancel: consuming.basic_cancel,
            m.BasicGet: consuming.basic_get,
            m.BasicAck: consuming.basic_ack,
            m.BasicNack: consuming.basic_nack,
            m.BasicReject: consuming.basic_reject,
            m.BasicRecover: consuming.basic_recover,
            m.BasicRecoverAsync: consuming.basic_recover,
            m.ConfirmSelect: publishing.confirm_select,
            m.TxSelect: publishing.tx_select,
            m.TxCommit: publishing.tx_commit,
            m.TxRollback: publishing.tx_rollback,
        }
        if not broker.authority:  # declarations run on gateway 0
            self.handlers.update(dict.fromkeys(FORWARDED, declaring.forward))
        broker.totals.channels_opened += 1

    def snapshot(self) -> ChannelInfo:
        """What the management API and the metrics show of this channel."""
        consumers = [*((c, False) for c in self.consumers.values()),
                     *((c, True) for c, _ in self.timed_out.values())]
        return ChannelInfo(
            number=self.number,
            consumers=tuple(ConsumerInfo(
                tag=c.tag, vhost=c.meta.spec.vhost, queue=c.meta.spec.name,
                ack_required=not c.no_ack,
                prefetch_count=c.prefetch, exclusive=c.exclusive, timed_out=timed_out,
                timeout_ms=c.timeout_ms, arguments=c.arguments, holder=c.holder)
                for c, timed_out in consumers),
            consumer_count=len(self.consumers) + (1 if self.reply_consumer else 0),
            messages_unacknowledged=len(self.unacked),
            messages_unconfirmed=self.confirms.outstanding if self.confirms else 0,
            prefetch_count=self.consumer_prefetch, global_prefetch_count=self.channel_prefetch,
            confirm=self.confirms is not None, transactional=self.tx is not None,
            closing=self.closing)

    # -- frames in -------------------------------------------------------------

    def handle_frame(self, frame_type: int, payload: bytes) -> None:
        if (frame_type == frames.FRAME_METHOD and len(payload) == hotpath.ACK_SIZE
                and payload[:4] == hotpath.ACK_IDS and not self._waiting
                and self.assembler.method is None):
            # basic.ack, a consumer's every message: what feed, command and
            # handle_method would do, without the layers or the method object.
            tag, bits = hotpath.ack_arguments(payload, 4)
            try:
                self.ack(tag, bool(bits & 1))
            except AMQPError as error:
                _name(error, m.BasicAck)
                raise
            return
        command = self.assembler.feed(frame_type, payload)
        if command is not None:
            self.command(*command)

    def command(self, method, properties: bytes | None = None, body: bytes = b"") -> None:
        """A complete command (a method, or a publish with its content): run it now,
        or keep it for its turn while the channel waits for a shard."""
        if self._waiting:
            self.backlog.append((method, properties, body))
            if len(self.backlog) == BACKLOG_LIMIT:
                self.conn.hold(self)
        else:
            self._execute(method, properties, body)

    def _execute(self, method, properties: bytes | None, body: bytes) -> None:
        if type(method) is AMQPError:  # a publish refused on arrival, in its turn
            raise method
        if properties is None:
            self.handle_method(method)
        else:
            self.publish(method, properties, body)

    def handle_method(self, method) -> None:
        handler = self.handlers.get(type(method))
        if handler is None:
            raise AMQPError(spec.COMMAND_INVALID, f"unexpected method {method.NAME}",
                            method.CLASS_ID, method.METHOD_ID)
        self._running = method
        try:
            handler(method)
        except AMQPError as error:
            _name(error, method)
            raise

    # -- waiting for a shard ---------------------------------------------------

    def request(self, peer: Peer, make, on_reply) -> None:
        """Send a request to a shard (or a gateway); park the channel until
        `on_reply(reply)` ran. An error it raises names the method that asked, as
        RabbitMQ's do."""
        self._waiting = True
        asking = self._running

        def answer(reply) -> None:
            try:
                on_reply(reply)
            except AMQPError as error:
                _name(error, asking)
                raise
            self.drain_backlog()

        def answered(reply) -> None:
            if self.closed or self.closing:
                return
            self._waiting = False
            self.conn.run_guarded(self, lambda: answer(reply))

        peer.request(make, answered)

    def drain_backlog(self) -> None:
        while self.backlog and not self._waiting and not self.closing:
            self._execute(*self.backlog.popleft())
        if len(self.backlog) < BACKLOG_LIMIT:
            self.conn.release(self)

    # -- channel class ---------------------------------------------------------

    def _channel_open(self, method: m.ChannelOpen) -> None:
        raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen")  # RabbitMQ's 504

    def _channel_flow(self, method: m.ChannelFlow) -> None:
        self.flow_active = method.active
        self.send(m.ChannelFlowOk(active=method.active))
        if method.active:
            held, self.held_deliveries = self.held_deliveries, []
            for data in held:
                self.conn.send(data)
            self.conn.owed_grants.update(c for c in self.consumers.values() if c.owed_credit)

    def _channel_close(self, method: m.ChannelClose) -> None:
        self.release()
        self.send(m.ChannelCloseOk())
        self.conn.forget_channel(self)

    def _channel_close_ok(self, method: m.ChannelCloseOk) -> None:
        pass  # only meaningful while closing; the connection handles that case

    def _access_request(self, method: m.AccessRequest) -> None:
        self.send(m.AccessRequestOk(ticket=1))

    # -- teardown --------------------------------------------------------------

    def release(self) -> None:
        """The channel is going away: requeue what it holds, drop its consumers."""
        if self.closed:
            return
        self.closed = True
        self.broker.totals.channels_closed += 1
        self.consuming.stop_replies()
        self.broker.release_holders(self.holder_ids)
        for consumer in self.consumers.values():
            self.conn.owed_grants.discard(consumer)
        self.consumers.clear()
        self.by_holder.clear()
        self.unacked.take_all()
        self.backlog.clear()
        self.conn.release(self)
        self.held_deliveries.clear()

    def shard_lost(self, link) -> None:
        """A shard died: its consumers are gone, and so are its deliveries' fates."""
        for consumer in [c for c in self.consumers.values() if c.link is link]:
            self.consumer_cancelled_by_broker(consumer.holder)
        if self.confirms is not None:
            self.confirms.fail_shard(link.index)
            self.conn.owed_confirms.add(self)
            self.conn.schedule_flush()


def _name(error: AMQPError, method) -> None:
    """Name the method an error answers, unless the error names one already."""
    if not error.class_id:
        error.class_id, error.method_id = method.CLASS_ID, method.METHOD_ID
