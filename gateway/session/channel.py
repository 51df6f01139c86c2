"""One AMQP channel: frames in, commands run in order, output, lookups and teardown.

Its methods live by concern in mixins: declarations.py (exchanges, queues,
bindings), consuming.py (consumers, credit, deliveries, get and settle) and
publishing.py (publish, routing, confirms, transactions).

A method that needs a shard's answer (say queue.delete) sends a request and
parks the channel: commands that arrive meanwhile wait in a backlog and run in
order once the answer is in, so a channel's methods always take effect in the
order the client sent them. Frames are decoded and content assembled as they
arrive, never on replay: a malformed frame is the sender's connection error at
once, wherever its channel is.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from warren.gateway.amqp import frames, hotpath, spec
from warren.gateway.amqp import methods as m
from warren.gateway.errors import AMQPError, queue_name
from warren.gateway.snapshots import ChannelInfo, ConsumerInfo
from warren.gateway.values import QueueMeta
from warren.shards import records as r

from .assembly import Assembler
from .confirms import ConfirmTracker
from .consuming import ConsumerState, Consuming
from .declaring import Declarations
from .publishing import Publishing
from .transaction import Transaction
from .unacked import Unacked

if TYPE_CHECKING:
    from .connection import Connection

# Commands a channel keeps while it waits for a shard before its connection stops
# being read (a publisher pipelining behind a queue.declare cannot grow it without end).
BACKLOG_LIMIT = 1000


class Channel(Declarations, Consuming, Publishing):
    def __init__(self, conn: "Connection", number: int):
        self.conn = conn
        self.number = number
        self.gateway = conn.gateway
        self.vhost = conn.vhost  # channels open only once the connection's vhost is set
        self.id = self.gateway.new_id()
        self.gateway.holders[self.id] = self
        self.holder_ids = {self.id}  # every holder this channel used, for release
        self.consumers: dict[str, ConsumerState] = {}
        self.by_holder: dict[int, ConsumerState] = {}
        self.unacked = Unacked()
        self.consumer_unacked = 0  # unacked deliveries to consumers (basic.get's excluded)
        self.next_tag = 1
        self.consumer_prefetch = 0
        self.channel_prefetch = 0
        self.confirms: ConfirmTracker | None = None
        self.tx: Transaction | None = None  # in transaction mode
        self.flow_active = True
        self.held_deliveries: list[bytes] = []  # while the client has flow off
        self.last_queue = ""
        self.reply_consumer: str | None = None  # consumer tag on amq.rabbitmq.reply-to
        # consumers cancelled by a timeout, listed (status timed_out) until the client
        # settles the deliveries that timed out: tag -> (consumer, their delivery tags)
        self.timed_out: dict[str, tuple[ConsumerState, set[int]]] = {}
        self.reply_key = ""
        self.reply_address = ""
        # mandatory replies sent to another gateway's reply-to address, until it says
        # whether they were delivered: number -> (method, properties, body, seq)
        self.remote_replies: dict[int, tuple] = {}
        self.replies_asked = 0
        self.closing = False  # we sent channel.close and wait for close-ok
        self.closed = False
        self.assembler = Assembler(self.gateway.config.max_message_size)
        self._waiting = False
        self._backlog: deque = deque()
        self._running = None  # the method being handled (a shard request's errors name it)
        self._routes = conn.routes  # shared by the connection's channels
        if not self.gateway.authority:  # declarations run on gateway 0
            self._handlers = Channel._forwarding_handlers
        self.gateway.totals.channels_opened += 1

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
                timeout_ms=c.timeout_ms, arguments=c.arguments) for c, timed_out in consumers),
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
            # basic.ack, a consumer's every message: what feed, _command and
            # handle_method would do, without the layers or the method object.
            tag, bits = hotpath.ack_arguments(payload, 4)
            try:
                self._ack(tag, bool(bits & 1))
            except AMQPError as error:
                _name(error, m.BasicAck)
                raise
            return
        command = self.assembler.feed(frame_type, payload)
        if command is not None:
            self._command(*command)

    def _command(self, method, properties: bytes | None = None, body: bytes = b"") -> None:
        """A complete command (a method, or a publish with its content): run it now,
        or keep it for its turn while the channel waits for a shard."""
        if self._waiting:
            self._backlog.append((method, properties, body))
            if len(self._backlog) == BACKLOG_LIMIT:
                self.conn.hold(self)
        else:
            self._execute(method, properties, body)

    def _execute(self, method, properties: bytes | None, body: bytes) -> None:
        if type(method) is AMQPError:  # a publish refused on arrival, in its turn
            raise method
        if properties is None:
            self.handle_method(method)
        else:
            self._publish(method, properties, body)

    def handle_method(self, method) -> None:
        handler = self._handlers.get(type(method))
        if handler is None:
            raise AMQPError(spec.COMMAND_INVALID, f"unexpected method {method.NAME}",
                            method.CLASS_ID, method.METHOD_ID)
        self._running = method
        try:
            handler(self, method)
        except AMQPError as error:
            _name(error, method)
            raise

    # -- waiting for a shard ---------------------------------------------------

    def _request(self, link, make, on_reply) -> None:
        """Send a request to a shard; park the channel until `on_reply(reply)` ran.
        An error it raises names the method that asked, as RabbitMQ's do."""
        self._waiting = True
        asking = self._running

        def answer(reply) -> None:
            try:
                on_reply(reply)
            except AMQPError as error:
                _name(error, asking)
                raise
            self._drain_backlog()

        def answered(reply) -> None:
            if self.closed or self.closing:
                return
            self._waiting = False
            self.conn.run_guarded(self, lambda: answer(reply))

        link.request(make, answered)

    def _drain_backlog(self) -> None:
        while self._backlog and not self._waiting and not self.closing:
            self._execute(*self._backlog.popleft())
        if len(self._backlog) < BACKLOG_LIMIT:
            self.conn.release(self)

    # -- output ----------------------------------------------------------------

    def send(self, method) -> None:
        self.conn.send(frames.method_frame(self.number, method))

    def _reply(self, method, nowait: bool = False) -> None:
        if not nowait:
            self.send(method)

    # -- lookups ---------------------------------------------------------------

    def _expand_queue_name(self, name: str) -> str:
        """A queue name as a method gives it: "" is the channel's last declared queue."""
        if name:
            return name
        if not self.last_queue:
            raise AMQPError(spec.NOT_FOUND, "no previously declared queue")
        return self.last_queue

    def _queue_named(self, name: str) -> QueueMeta:
        name = self._expand_queue_name(name)
        meta = self.vhost.queues.get(name)
        if meta is None:
            raise AMQPError(spec.NOT_FOUND, f"no {queue_name(self.vhost.name, name)}")
        self._check_exclusive(meta)
        return meta

    def _check_exclusive(self, meta: QueueMeta, redeclared_exclusive: bool | None = None) -> None:
        """405 unless this connection may use the queue: an exclusive queue is its
        owner's alone, and a redeclaration must repeat the queue's exclusivity, even
        on the owning connection (RabbitMQ's strict check)."""
        if redeclared_exclusive is None:
            allowed = meta.owner is None or meta.owner is self.conn
        else:
            allowed = meta.owner is (self.conn if redeclared_exclusive else None)
        if not allowed:
            raise AMQPError(
                spec.RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked "
                f"{queue_name(meta.spec.vhost, meta.spec.name)}. "
                "It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration.")

    def _allow(self, access: str, kind: str, name: str) -> None:
        """403 unless this connection's user has `access` to the resource."""
        self.gateway.access.check(self.conn.user, self.vhost.name, access, kind, name)

    def _link(self, meta: QueueMeta):
        return self.gateway.shards[meta.shard]

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
        self.gateway.totals.channels_closed += 1
        self._stop_replies()
        holders = list(self.holder_ids)
        for link in self.gateway.shards:
            link.send(r.ReleaseHolders(holders))
        for holder in holders:
            self.gateway.holders.pop(holder, None)
        for consumer in self.consumers.values():
            self.conn.owed_grants.discard(consumer)
        self.consumers.clear()
        self.by_holder.clear()
        self.unacked.take_all()
        self._backlog.clear()
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


Channel._handlers = {
    m.ChannelOpen: Channel._channel_open,
    m.ChannelFlow: Channel._channel_flow,
    m.ChannelClose: Channel._channel_close,
    m.ChannelCloseOk: Channel._channel_close_ok,
    m.AccessRequest: Channel._access_request,
    m.ExchangeDeclare: Channel._exchange_declare,
    m.ExchangeDelete: Channel._exchange_delete,
    m.ExchangeBind: Channel._exchange_bind,
    m.ExchangeUnbind: Channel._exchange_unbind,
    m.QueueDeclare: Channel._queue_declare,
    m.QueueBind: Channel._queue_bind,
    m.QueueUnbind: Channel._queue_unbind,
    m.QueuePurge: Channel._queue_purge,
    m.QueueDelete: Channel._queue_delete,
    m.BasicQos: Channel._basic_qos,
    m.BasicConsume: Channel._basic_consume,
    m.BasicCancel: Channel._basic_cancel,
    m.BasicGet: Channel._basic_get,
    m.BasicAck: Channel._basic_ack,
    m.BasicNack: Channel._basic_nack,
    m.BasicReject: Channel._basic_reject,
    m.BasicRecover: Channel._basic_recover,
    m.BasicRecoverAsync: Channel._basic_recover,
    m.ConfirmSelect: Channel._confirm_select,
    m.TxSelect: Channel._tx_select,
    m.TxCommit: Channel._tx_commit,
    m.TxRollback: Channel._tx_rollback,
}

# Another gateway's channel: what changes the catalogue, gateway 0 runs (purge does not).
Channel._forwarding_handlers = {
    **Channel._handlers,
    **dict.fromkeys((m.ExchangeDeclare, m.ExchangeDelete, m.ExchangeBind, m.ExchangeUnbind,
                     m.QueueDeclare, m.QueueBind, m.QueueUnbind, m.QueueDelete),
                    Channel._forward),
}
