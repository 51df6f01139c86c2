"""One AMQP channel: its methods, content assembly, delivery tags and confirms.

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

from warren.shards import records as r

from . import arguments, replyto
from .amqp import frames, hotpath, spec
from .amqp import methods as m
from .amqp.properties import (
    PropertiesError,
    decode_properties,
    encode_properties,
    flag_mask,
    peek_delivery_mode,
    peek_expiration,
    peek_priority,
    peek_reply_to,
)
from .assembly import BASIC_CLASS, Assembler
from .broker import QueueMeta, server_generated_name
from .confirms import ConfirmTracker
from .errors import AMQPError, exchange_name, queue_name, refusal_error
from .exchange import EXCHANGE, EXCHANGE_TYPES, QUEUE, RENEW_EXCHANGE, Exchange
from .transaction import PUBLISH, Transaction
from .unacked import Delivery, Unacked

if TYPE_CHECKING:
    from .connection import Connection

_EXPIRATION = flag_mask("expiration")
_PRIORITY = flag_mask("priority")
_REPLY_TO = flag_mask("reply_to")
_HEADERS = flag_mask("headers")
_EXTRAS = _EXPIRATION | _PRIORITY | _REPLY_TO | _HEADERS
# Link credit of a consumer outside a channel-wide limit: how many deliveries may
# be on their way between its shard and the socket. Credit comes back as
# deliveries are written to the socket, so a slow reader stops its shard.
FLOW_WINDOW = 2000
# Commands a channel keeps while it waits for a shard before its connection stops
# being read (a publisher pipelining behind a queue.declare cannot grow it without end).
BACKLOG_LIMIT = 1000


class ConsumerState:
    """The gateway's side of a consumer. Credit is handed out in one of two modes:

    * window: FLOW_WINDOW credit, returned as deliveries leave through the socket
      (no-ack consumers, and every consumer of a channel without a global limit);
    * limited: manual-ack consumers of a channel with basic.qos global=true share
      the channel's limit; credit comes back only as deliveries are settled, and
      credit outstanding + unacked never exceeds the limit (DESIGN.md, prefetch).
    """

    __slots__ = ("tag", "tag_shortstr", "holder", "meta", "link", "no_ack", "exclusive",
                 "prefetch", "credit", "owed_credit", "unacked", "timeout_ms", "timed_out",
                 "arguments")

    def __init__(self, tag: str, holder: int, meta: QueueMeta, link, no_ack: bool,
                 exclusive: bool, prefetch: int, timeout_ms: int = 0,
                 arguments: dict | None = None):
        self.tag = tag
        self.tag_shortstr = hotpath.shortstr(tag)
        self.holder = holder
        self.meta = meta
        self.link = link
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # its own limit (global=false), enforced by the shard
        self.credit = 0  # granted to the shard minus deliveries seen
        self.owed_credit = 0  # window mode: written out, credit not yet returned
        self.unacked = 0
        self.timeout_ms = timeout_ms  # consumer timeout (quorum queues), 0: none
        self.timed_out = False  # a timeout hit it (it stays listed until cancelled)
        self.arguments = arguments or {}

    def useful_credit(self) -> int | None:
        """Credit it could use under its own limit; None when it has none."""
        if self.no_ack or not self.prefetch:
            return None
        return max(self.prefetch - self.unacked - max(self.credit, 0), 0)


class Channel:
    def __init__(self, conn: "Connection", number: int):
        self.conn = conn
        self.number = number
        self.broker = conn.broker
        self.id = self.broker.new_id()
        self.broker.holders[self.id] = self
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
        self.closing = False  # we sent channel.close and wait for close-ok
        self.closed = False
        self.assembler = Assembler(self.broker.config.max_message_size)
        self._waiting = False
        self._backlog: deque = deque()

    @property
    def vhost(self):
        return self.conn.vhost

    # -- frames in -------------------------------------------------------------

    def handle_frame(self, frame_type: int, payload: bytes) -> None:
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
        try:
            handler(self, method)
        except AMQPError as error:
            if not error.class_id:
                error.class_id, error.method_id = method.CLASS_ID, method.METHOD_ID
            raise

    # -- waiting for a shard ---------------------------------------------------

    def _request(self, link, make, on_reply) -> None:
        """Send a request to a shard; park the channel until `on_reply(reply)` ran."""
        self._waiting = True

        def answered(reply) -> None:
            if self.closed or self.closing:
                return
            self._waiting = False
            self.conn.run_guarded(self, lambda: (on_reply(reply), self._drain_backlog()))

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
                f"cannot obtain exclusive access to locked {queue_name(meta.vhost, meta.name)}. "
                "It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration.")

    def _allow(self, access: str, kind: str, name: str) -> None:
        """403 unless this connection's user has `access` to the resource."""
        self.broker.access.check(self.conn.user, self.vhost.name, access, kind, name)

    def _link(self, meta: QueueMeta):
        return self.broker.links[meta.shard]

    # -- channel class ---------------------------------------------------------

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

    # -- exchanges -------------------------------------------------------------

    def _exchange_declare(self, method: m.ExchangeDeclare) -> None:
        vhost = self.vhost
        name = method.exchange
        if not method.passive and method.type not in EXCHANGE_TYPES:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown exchange type '{method.type}'")
        _not_default(name)
        existing = vhost.exchanges.get(name)
        if method.passive:
            if existing is None:
                raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(vhost.name, name)}")
            return self._reply(m.ExchangeDeclareOk(), method.nowait)
        what = exchange_name(vhost.name, name)
        self._allow("configure", "exchange", name)
        if existing is None:
            if name.startswith("amq."):
                raise AMQPError(spec.ACCESS_REFUSED,
                                f"exchange name '{name}' contains reserved prefix 'amq.*'")
            arguments.validate(method.arguments, arguments.EXCHANGE_ARGUMENTS, what)
            self.broker.add_exchange(Exchange(vhost.name, name, method.type, method.durable,
                                              method.auto_delete, method.internal,
                                              method.arguments))
        else:
            _equivalent("type", what, method.type, existing.type)
            _equivalent("durable", what, method.durable, existing.durable)
            _equivalent("auto_delete", what, method.auto_delete, existing.auto_delete)
            _equivalent("internal", what, method.internal, existing.internal)
            arguments.assert_equivalent(method.arguments, existing.arguments,
                                        arguments.EXCHANGE_ARGUMENTS, what)
        self._reply(m.ExchangeDeclareOk(), method.nowait)

    def _exchange_delete(self, method: m.ExchangeDelete) -> None:
        name = method.exchange
        _not_default(name)
        if name.startswith("amq."):  # refused even when no such exchange exists
            raise AMQPError(spec.ACCESS_REFUSED, f"deletion of system "
                            f"{exchange_name(self.vhost.name, name)} not allowed")
        self._allow("configure", "exchange", name)
        exchange = self.vhost.exchanges.get(name)
        if exchange is not None:
            if method.if_unused and exchange.bindings:
                raise AMQPError(spec.PRECONDITION_FAILED,
                                f"{exchange_name(self.vhost.name, name)} in use")
            self.broker.delete_exchange(exchange)
        self._reply(m.ExchangeDeleteOk(), method.nowait)

    def _exchange_bind(self, method: m.ExchangeBind) -> None:
        self._bind(method.source, (EXCHANGE, method.destination), method.routing_key,
                   method.arguments)
        self._reply(m.ExchangeBindOk(), method.nowait)

    def _exchange_unbind(self, method: m.ExchangeUnbind) -> None:
        self._unbind(method.source, (EXCHANGE, method.destination), method.routing_key,
                     method.arguments)
        self._reply(m.ExchangeUnbindOk(), method.nowait)

    # -- bindings --------------------------------------------------------------

    def _binding_ends(self, source: str, destination: tuple) -> tuple:
        """The source exchange and the destination (queue or exchange) of a bind or
        unbind, None where missing, after RabbitMQ's checks that come first:
        permissions and the default exchange."""
        kind, name = destination
        self._allow("write", kind, name)
        _not_default(source)
        if kind == EXCHANGE:
            _not_default(name)
        self._allow("read", "exchange", source)
        found = self.vhost.queues if kind == QUEUE else self.vhost.exchanges
        return self.vhost.exchanges.get(source), found.get(name)

    def _bind(self, source_name: str, destination: tuple, routing_key: str,
              arguments: dict) -> None:
        """Both ends must exist: 404 for the missing one, the source first (RabbitMQ's
        order), before an exclusive queue's 405."""
        source, target = self._binding_ends(source_name, destination)
        kind, name = destination
        if source is None:
            raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(self.vhost.name, source_name)}")
        if target is None:
            describe = queue_name if kind == QUEUE else exchange_name
            raise AMQPError(spec.NOT_FOUND, f"no {describe(self.vhost.name, name)}")
        if kind == QUEUE:
            self._check_exclusive(target)
        self.broker.bind(source, destination, routing_key, arguments)

    def _unbind(self, source_name: str, destination: tuple, routing_key: str,
                arguments: dict) -> None:
        """As in RabbitMQ 3.10, removing a binding that does not exist, or whose queue
        or exchange does not, succeeds; only an existing binding checks exclusivity."""
        source, target = self._binding_ends(source_name, destination)
        if (source is None or target is None
                or not source.has_binding(destination, routing_key, arguments)):
            return
        if destination[0] == QUEUE:
            self._check_exclusive(target)
        self.broker.unbind(source, destination, routing_key, arguments)

    # -- queues ----------------------------------------------------------------

    def _queue_declare(self, method: m.QueueDeclare) -> None:
        vhost = self.vhost
        name = method.queue
        if method.passive:
            if replyto.is_reply_queue(name) and self.broker.reply_channel(name) is not None:
                return self._reply(m.QueueDeclareOk(queue=name, message_count=0,
                                                    consumer_count=1), method.nowait)
            meta = self._queue_named(name)
            return self._queue_declare_existing(method, meta)
        if name == "":
            name = server_generated_name("amq.gen-")
        elif name.startswith("amq."):
            raise AMQPError(spec.ACCESS_REFUSED,
                            f"queue name '{name}' contains reserved prefix 'amq.*'")
        what = queue_name(vhost.name, name)
        # An exclusive queue dies with its connection: RabbitMQ ignores durable for it.
        durable = method.durable and not method.exclusive
        self._allow("configure", "queue", name)
        meta = vhost.queues.get(name)
        if meta is not None:
            self._check_exclusive(meta, redeclared_exclusive=method.exclusive)
            _equivalent("durable", what, durable, meta.durable)
            _equivalent("auto_delete", what, method.auto_delete, meta.auto_delete)
            arguments.assert_equivalent(method.arguments, meta.arguments,
                                        arguments.QUEUE_ARGUMENTS, what)
            return self._queue_declare_existing(method, meta)
        arguments.check_queue_type(method.arguments, durable, method.exclusive,
                                   method.auto_delete, what)
        arguments.validate(method.arguments, arguments.QUEUE_ARGUMENTS, what)
        limit = self.broker.vhost_limit(vhost.name, "max-queues")
        if 0 <= limit <= len(vhost.queues):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"cannot declare queue '{name}' in vhost '{vhost.name}': vhost queue "
                            f"limit ({limit}) is reached")
        owner = self.conn if method.exclusive else None
        meta = self.broker.create_queue(vhost, name, durable, owner, method.auto_delete,
                                        method.arguments)
        self.last_queue = name
        self._reply(m.QueueDeclareOk(queue=name, message_count=0, consumer_count=0),
                    method.nowait)

    def _queue_declare_existing(self, method: m.QueueDeclare, meta: QueueMeta) -> None:
        self.last_queue = meta.name
        if method.nowait:
            return

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                raise refusal_error(reply.refused, meta.vhost, meta.name)
            self.send(m.QueueDeclareOk(queue=meta.name, message_count=reply.message_count,
                                       consumer_count=reply.consumer_count))

        self._request(self._link(meta), lambda req: r.QueueStatus(req, meta.qid), answered)

    def _queue_bind(self, method: m.QueueBind) -> None:
        queue, routing_key = self._queue_binding(method)
        self._bind(method.exchange, (QUEUE, queue), routing_key, method.arguments)
        self._reply(m.QueueBindOk(), method.nowait)

    def _queue_unbind(self, method: m.QueueUnbind) -> None:
        queue, routing_key = self._queue_binding(method)
        self._unbind(method.exchange, (QUEUE, queue), routing_key, method.arguments)
        self.send(m.QueueUnbindOk())

    def _queue_binding(self, method: m.QueueBind | m.QueueUnbind) -> tuple[str, str]:
        """The queue and routing key of a queue.bind or unbind. With neither given,
        both are the channel's last declared queue (RabbitMQ's shortcut)."""
        queue = self._expand_queue_name(method.queue)
        if not method.queue and not method.routing_key:
            return queue, queue
        return queue, method.routing_key

    def _queue_purge(self, method: m.QueuePurge) -> None:
        meta = self._queue_named(method.queue)
        self._allow("read", "queue", meta.name)

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                raise refusal_error(reply.refused, meta.vhost, meta.name)
            self._reply(m.QueuePurgeOk(message_count=reply.message_count), method.nowait)

        self._request(self._link(meta), lambda req: r.PurgeQueue(req, meta.qid), answered)

    def _queue_delete(self, method: m.QueueDelete) -> None:
        name = self._expand_queue_name(method.queue)
        meta = self.vhost.queues.get(name)
        if meta is None:
            # Deleting a queue that does not exist succeeds, as in RabbitMQ.
            return self._reply(m.QueueDeleteOk(message_count=0), method.nowait)
        self._check_exclusive(meta)
        self._allow("configure", "queue", meta.name)

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                raise refusal_error(reply.refused, meta.vhost, meta.name)
            self.broker.forget_queue(meta)
            self._reply(m.QueueDeleteOk(message_count=reply.message_count), method.nowait)

        self._request(self._link(meta),
                      lambda req: r.DeleteQueue(req, meta.qid, method.if_unused, method.if_empty),
                      answered)

    # -- basic: consuming ------------------------------------------------------

    def _basic_qos(self, method: m.BasicQos) -> None:
        if method.prefetch_size:
            raise AMQPError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self._set_channel_prefetch(method.prefetch_count)
        else:
            self.consumer_prefetch = method.prefetch_count
        self.send(m.BasicQosOk())

    def _limited(self, consumer: ConsumerState) -> bool:
        return bool(self.channel_prefetch) and not consumer.no_ack

    def _set_channel_prefetch(self, limit: int) -> None:
        """Re-deal credit under the new limit; deliveries already on their way may
        briefly leave more unacked than it (DESIGN.md)."""
        was_limited = bool(self.channel_prefetch)
        self.channel_prefetch = limit
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
        if not self.channel_prefetch:
            return
        limited = [c for c in self.consumers.values() if not c.no_ack]
        if not limited:
            return
        free = (self.channel_prefetch - self.consumer_unacked
                - sum(max(c.credit, 0) for c in limited))
        if free <= 0:
            return
        # Never deal a consumer more than its own prefetch lets it use: that credit
        # would sit idle while another consumer of the channel could use it.
        room = {c: c.useful_credit() for c in limited}
        grants = dict.fromkeys(limited, 0)
        limited.sort(key=lambda c: c.credit)
        while free > 0:
            takers = [c for c in limited if room[c] is None or room[c] > grants[c]]
            if not takers:
                break
            for consumer in takers[:free]:
                grants[consumer] += 1
            free -= min(free, len(takers))
        for consumer, credit in grants.items():
            if credit:
                consumer.credit += credit
                consumer.link.send(r.Grant(consumer.meta.qid, consumer.holder, credit))

    def _basic_consume(self, method: m.BasicConsume) -> None:
        if method.queue == replyto.REPLY_QUEUE:
            return self._consume_replies(method)
        meta = self._queue_named(method.queue)
        self._allow("read", "queue", meta.name)
        tag = method.consumer_tag or server_generated_name("amq.ctag-")
        if tag in self.consumers or tag == self.reply_consumer:
            raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        priority = method.arguments.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"invalid arg 'x-priority' for {queue_name(meta.vhost, meta.name)}")
        timeout_ms = self._consumer_timeout(method, meta)
        holder = self.broker.new_id()
        link = self._link(meta)
        consumer = ConsumerState(tag, holder, meta, link, method.no_ack, method.exclusive,
                                 self.consumer_prefetch, timeout_ms, method.arguments)
        consumer.credit = 0 if self._limited(consumer) else FLOW_WINDOW
        self.consumers[tag] = consumer
        self.by_holder[holder] = consumer
        self.holder_ids.add(holder)
        self.broker.holders[holder] = self

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                self._forget_consumer(consumer)
                raise refusal_error(reply.refused, meta.vhost, meta.name)
            self._reply(m.BasicConsumeOk(consumer_tag=tag), method.nowait)

        self._request(link, lambda req: r.Consume(
            req, meta.qid, holder, self.id, tag, method.no_ack, method.exclusive,
            self.consumer_prefetch, consumer.credit, priority, timeout_ms), answered)
        self._deal_credit()

    def _consumer_timeout(self, method: m.BasicConsume, meta: QueueMeta) -> int:
        """The consumer timeout in ms (quorum queues only; classic ones have none):
        the consumer's x-consumer-timeout, else min(queue argument, policy), else
        the broker's consumer_timeout (RabbitMQ 4.3's precedence)."""
        own = method.arguments.get("x-consumer-timeout")
        if own is not None and (isinstance(own, bool) or not isinstance(own, int) or own <= 0):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"invalid arg 'x-consumer-timeout' for "
                            f"{queue_name(meta.vhost, meta.name)}")
        if meta.queue_type != "quorum" or method.no_ack:
            return 0
        if own is not None:
            return own
        return meta.effective.get("x-consumer-timeout") or self.broker.config.consumer_timeout

    def consumer_timed_out(self, event: r.ConsumerTimedOut) -> None:
        """RabbitMQ 4.3: cancel just that consumer for clients that understand
        basic.cancel; close the channel for the others."""
        consumer = self.by_holder.get(event.holder)
        if consumer is None or self.closing or self.closed:
            return
        consumer.timed_out = True
        if self.conn.capabilities.get("consumer_cancel_notify"):
            # Its deliveries stay unacked here: acking them later is no error.
            seqs = set(event.seqs)
            tags = self.unacked.tags_of(consumer.holder, seqs)
            if tags:
                self.timed_out[consumer.tag] = (consumer, tags)
            self._forget_consumer(consumer)
            consumer.link.send(r.Cancel(0, consumer.meta.qid, consumer.holder))
            self.send(m.BasicCancel(consumer_tag=consumer.tag, nowait=True))
        else:
            self.conn.close_channel_with_error(self, AMQPError(
                spec.PRECONDITION_FAILED,
                f"delivery acknowledgement on channel {self.number} timed out. Timeout value "
                f"used: {event.timeout_ms} ms. This timeout value can be configured, see "
                "consumers doc guide to learn more"))

    def _settled_timed_out(self, tags: set[int]) -> None:
        for consumer_tag, (_consumer, pending) in list(self.timed_out.items()):
            pending -= tags
            if not pending:
                del self.timed_out[consumer_tag]

    def _consume_replies(self, method: m.BasicConsume) -> None:
        if not method.no_ack:
            raise AMQPError(spec.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_consumer is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "reply consumer already set")
        tag = method.consumer_tag or server_generated_name("amq.ctag-")
        if tag in self.consumers:
            raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        self.reply_consumer = tag
        self.reply_key, self.reply_address = replyto.new_address()
        self.broker.reply_channels[self.reply_key] = self
        self._reply(m.BasicConsumeOk(consumer_tag=tag), method.nowait)

    def _stop_replies(self) -> None:
        if self.reply_consumer is not None:
            self.broker.reply_channels.pop(self.reply_key, None)
            self.reply_consumer = None

    def _basic_cancel(self, method: m.BasicCancel) -> None:
        if method.consumer_tag == self.reply_consumer and self.reply_consumer is not None:
            self._stop_replies()
            return self._reply(m.BasicCancelOk(consumer_tag=method.consumer_tag), method.nowait)
        consumer = self.consumers.get(method.consumer_tag)
        if consumer is None:
            # Not an error: the broker may have cancelled it already (queue deleted).
            return self._reply(m.BasicCancelOk(consumer_tag=method.consumer_tag), method.nowait)

        def answered(reply: r.Reply) -> None:
            self._forget_consumer(consumer)
            self._reply(m.BasicCancelOk(consumer_tag=consumer.tag), method.nowait)

        self._request(consumer.link, lambda req: r.Cancel(req, consumer.meta.qid, consumer.holder),
                      answered)

    def _forget_consumer(self, consumer: ConsumerState) -> None:
        self.consumers.pop(consumer.tag, None)
        self.by_holder.pop(consumer.holder, None)
        self.broker.holders.pop(consumer.holder, None)
        self.conn.owed_grants.discard(consumer)
        self._deal_credit()  # a limited consumer's credit went with it

    def consumer_cancelled_by_broker(self, holder: int) -> None:
        consumer = self.by_holder.get(holder)
        if consumer is None or self.closing:
            return
        self._forget_consumer(consumer)
        if self.conn.capabilities.get("consumer_cancel_notify"):
            self.send(m.BasicCancel(consumer_tag=consumer.tag, nowait=True))

    def deliver(self, link, event: r.Deliver) -> None:
        consumer = self.by_holder.get(event.holder)
        if consumer is None or self.closing:
            return  # cancelled meanwhile; the shard requeues what this holder kept
        tag = self.next_tag
        self.next_tag += 1
        consumer.credit -= 1
        if not consumer.no_ack:
            self.unacked.add(tag, Delivery(link, event.qid, event.holder, event.seq))
            self.consumer_unacked += 1
            consumer.unacked += 1
        properties = event.properties
        if event.delivery_count:
            properties = _with_delivery_count(properties, event.delivery_count)
        data = frames.content_frames(
            self.number,
            hotpath.deliver_payload(consumer.tag_shortstr, tag, event.redelivered,
                                    event.exchange, event.routing_key),
            BASIC_CLASS, properties, event.body, self.conn.frame_max)
        if self.flow_active:
            self.conn.send(data)
        else:
            self.held_deliveries.append(data)
        if not self._limited(consumer):
            consumer.owed_credit += 1
            self.conn.owed_grants.add(consumer)
            self.conn.schedule_flush()

    def return_credit(self, consumer: ConsumerState) -> None:
        """Window mode: give back the credit of deliveries that left through the socket."""
        if consumer.owed_credit and self.flow_active and consumer.holder in self.by_holder:
            consumer.link.send(r.Grant(consumer.meta.qid, consumer.holder, consumer.owed_credit))
            consumer.credit += consumer.owed_credit
            consumer.owed_credit = 0

    # -- basic: get and settle -------------------------------------------------

    def _basic_get(self, method: m.BasicGet) -> None:
        meta = self._queue_named(method.queue)
        self._allow("read", "queue", meta.name)
        link = self._link(meta)

        def answered(reply: r.GetReply) -> None:
            if reply.refused:
                raise refusal_error(reply.refused, meta.vhost, meta.name)
            if reply.seq == 0:
                return self.send(m.BasicGetEmpty())
            tag = self.next_tag
            self.next_tag += 1
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

        self._request(link, lambda req: r.Get(req, meta.qid, self.id, method.no_ack), answered)

    def _settle(self, taken: list[tuple[int, Delivery]], outcome: int) -> None:
        if self.tx is not None:
            self.tx.settle(taken, outcome)
        else:
            self._settle_now(taken, outcome)

    def _settle_now(self, taken: list[tuple[int, Delivery]], outcome: int) -> None:
        groups: dict[tuple, list[int]] = {}
        if self.timed_out:
            self._settled_timed_out({tag for tag, _ in taken})
        for _tag, (link, qid, holder, seq) in taken:
            groups.setdefault((link, qid, holder), []).append(seq)
            if holder != self.id:
                self.consumer_unacked -= 1
                consumer = self.by_holder.get(holder)
                if consumer is not None:
                    consumer.unacked -= 1
        for (link, qid, holder), seqs in groups.items():
            link.send(r.Settle(qid, holder, seqs, outcome))
        self._deal_credit()

    def _basic_ack(self, method: m.BasicAck) -> None:
        self._settle(self.unacked.take(method.delivery_tag, method.multiple), r.SETTLE_ACK)

    def _basic_nack(self, method: m.BasicNack) -> None:
        # A nack with requeue is not a failed delivery (RabbitMQ 4.3 counting).
        outcome = r.SETTLE_RETURN if method.requeue else r.SETTLE_DISCARD
        self._settle(self.unacked.take(method.delivery_tag, method.multiple), outcome)

    def _basic_reject(self, method: m.BasicReject) -> None:
        outcome = r.SETTLE_REQUEUE if method.requeue else r.SETTLE_DISCARD
        self._settle(self.unacked.take(method.delivery_tag, False), outcome)

    def _basic_recover(self, method) -> None:
        if not method.requeue:
            raise AMQPError(spec.NOT_IMPLEMENTED, "requeue=false")
        self._settle_now(self.unacked.take_all(), r.SETTLE_REQUEUE)
        if type(method) is m.BasicRecover:
            self.send(m.BasicRecoverOk())

    # -- basic: publish and confirms -------------------------------------------

    def _publish(self, method: hotpath.Publish, properties: bytes, body: bytes) -> None:
        if method.immediate:
            raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true",
                            method.CLASS_ID, method.METHOD_ID)
        vhost = self.vhost
        exchange = vhost.exchanges.get(method.exchange)
        if exchange is None:
            raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(vhost.name, method.exchange)}",
                            method.CLASS_ID, method.METHOD_ID)
        self._allow("write", "exchange", exchange.name)
        if exchange.internal:
            raise AMQPError(spec.ACCESS_REFUSED,
                            f"cannot publish to internal {exchange_name(vhost.name, exchange.name)}",
                            method.CLASS_ID, method.METHOD_ID)
        if exchange.name == RENEW_EXCHANGE:
            return self._renew(method.routing_key, properties)
        expiration, priority, also = -1, 0, ()
        if len(properties) >= 2 and (properties[0] << 8 | properties[1]) & _EXTRAS:
            try:
                expiration, priority, also, properties = self._read_extras(properties)
            except AMQPError as error:
                error.class_id, error.method_id = method.CLASS_ID, method.METHOD_ID
                raise
        if not self.conn.has_published or self.broker.alarms:
            self.conn.note_publish()
        if self.tx is not None:
            self.tx.publish(method, properties, body, expiration, priority, also)
        else:
            self._route(method, properties, body, expiration, priority, also)

    def _renew(self, consumer_tag: str, properties: bytes) -> None:
        """Warren's lock renewal: a publish to amq.warren.renew with the consumer tag
        as routing key and header x-delivery-tag (or x-renew-all = true) extends the
        lock of those deliveries by the consumer's timeout."""
        consumer = self.consumers.get(consumer_tag)
        if consumer is None:
            raise AMQPError(spec.PRECONDITION_FAILED, f"unknown consumer tag '{consumer_tag}'",
                            BASIC_CLASS, m.BasicPublish.METHOD_ID)
        headers = _headers_of(properties)()
        if headers.get("x-renew-all") is True:
            seqs = []
        else:
            tag = headers.get("x-delivery-tag")
            delivery = self.unacked.get(tag) if isinstance(tag, int) else None
            if delivery is None or delivery.holder != consumer.holder:
                raise AMQPError(spec.PRECONDITION_FAILED, f"unknown delivery tag {tag}",
                                BASIC_CLASS, m.BasicPublish.METHOD_ID)
            seqs = [delivery.seq]
        consumer.link.send(r.Renew(consumer.meta.qid, consumer.holder, seqs))
        self._confirm_at_once(self._tracker())

    def _confirm_at_once(self, tracker) -> None:
        """A publish no queue has to store (a renewal, a direct reply) is confirmed
        right away in confirm mode (and counts in a transaction)."""
        if tracker is not None:
            tracker.publish(())
            self._confirms_changed()

    def _read_extras(self, properties: bytes) -> tuple[int, int, tuple, bytes]:
        """The properties the broker acts on: expiration (ms, -1 if none), priority,
        the CC and BCC headers (more routing keys, RabbitMQ's sender-selected
        distribution; BCC is removed before delivery) and a reply_to of
        amq.rabbitmq.reply-to, replaced by this channel's address."""
        flags = properties[0] << 8 | properties[1]
        also: tuple = ()
        try:
            expiration = -1
            if flags & _EXPIRATION:
                expiration = _parse_expiration(peek_expiration(properties))
            priority = peek_priority(properties) or 0 if flags & _PRIORITY else 0
            props, changed = None, False
            if flags & _HEADERS:
                props = decode_properties(properties)
                headers = props.headers or {}
                also = tuple(_routing_keys(headers.get("CC")) + _routing_keys(headers.get("BCC")))
                if "BCC" in headers:
                    props.headers = {k: v for k, v in headers.items() if k != "BCC"}
                    changed = True
            if flags & _REPLY_TO and peek_reply_to(properties) == replyto.REPLY_QUEUE:
                if self.reply_consumer is None:
                    raise AMQPError(spec.PRECONDITION_FAILED, "fast reply consumer does not exist")
                props = props or decode_properties(properties)
                props.reply_to = self.reply_address
                changed = True
            if changed:
                properties = encode_properties(props)
        except PropertiesError as error:
            raise AMQPError(spec.SYNTAX_ERROR, f"malformed content properties: {error}") from None
        return expiration, priority, also, properties

    def _route(self, method: hotpath.Publish, properties: bytes, body: bytes,
               expiration: int = -1, priority: int = 0, also: tuple = ()) -> None:
        """Send a message to the shards of every queue it routes to, in one record each."""
        vhost = self.vhost
        exchange = vhost.exchanges.get(method.exchange)
        routing_key = method.routing_key
        tracker = self._tracker()
        if exchange is None:
            targets = []
        elif exchange.name == "" and not also:  # the default exchange: the queue named
            meta = vhost.queues.get(routing_key)
            if meta is None and routing_key.startswith(replyto.REPLY_QUEUE):
                return self._route_reply(method, properties, body, tracker)
            targets = [meta] if meta is not None else []
        else:
            headers = _headers_of(properties)
            targets = self.broker.route(vhost, exchange, routing_key, headers)
            for key in also:  # CC / BCC routing keys
                targets = _union(targets, self.broker.route(vhost, exchange, key, headers))
        try:
            persistent = peek_delivery_mode(properties) == 2
        except PropertiesError as error:
            raise AMQPError(spec.SYNTAX_ERROR, f"malformed content properties: {error}",
                            method.CLASS_ID, method.METHOD_ID) from None
        shards = {meta.shard for meta in targets}
        seq = tracker.publish(shards) if tracker is not None else 0
        if not targets and method.mandatory:
            self._return_unroutable(method, properties, body)
        if targets:
            self.broker.publish(targets, method.exchange, routing_key, properties, body,
                                persistent, expiration, priority,
                                self.id if seq else 0, seq, tracker if seq else None, self.conn)
        if seq:
            self._confirms_changed()

    def _route_reply(self, method: hotpath.Publish, properties: bytes, body: bytes,
                     tracker) -> None:
        """A reply to a direct reply-to address: straight to that channel."""
        channel = self.broker.reply_channel(method.routing_key)
        self._confirm_at_once(tracker)
        if channel is None:
            if method.mandatory:
                self._return_unroutable(method, properties, body)
            return
        channel.deliver_reply(method.exchange, method.routing_key, properties, body)

    def _return_unroutable(self, method: hotpath.Publish, properties: bytes, body: bytes) -> None:
        self.conn.send(frames.content_frames(
            self.number,
            m.encode_method(m.BasicReturn(reply_code=spec.NO_ROUTE, reply_text="NO_ROUTE",
                                          exchange=method.exchange,
                                          routing_key=method.routing_key)),
            BASIC_CLASS, properties, body, self.conn.frame_max))

    def deliver_reply(self, exchange: str, routing_key: str, properties: bytes,
                      body: bytes) -> None:
        if self.reply_consumer is None or self.closing or self.closed:
            return
        tag = self.next_tag
        self.next_tag += 1
        self.conn.send(frames.content_frames(
            self.number,
            hotpath.deliver_payload(hotpath.shortstr(self.reply_consumer), tag, False, exchange,
                                    routing_key),
            BASIC_CLASS, properties, body, self.conn.frame_max))
        self.conn.schedule_flush()

    def _confirm_select(self, method: m.ConfirmSelect) -> None:
        if self.tx is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = ConfirmTracker()
        self._reply(m.ConfirmSelectOk(), method.nowait)

    def _tracker(self) -> ConfirmTracker | None:
        """Who counts the shards' acceptance of publishes: confirm mode's tracker,
        or a transaction's (commit-ok waits for it)."""
        if self.confirms is not None:
            return self.confirms
        return self.tx.stored if self.tx is not None else None

    def confirmed(self, seq: int, shard: int) -> None:
        tracker = self._tracker()
        if tracker is not None and not self.closing:
            tracker.accept(seq, shard)
            self._confirms_changed()

    def rejected(self, seq: int, shard: int) -> None:
        tracker = self._tracker()
        if tracker is not None and not self.closing:
            tracker.reject(seq, shard)
            self._confirms_changed()

    def _confirms_changed(self) -> None:
        if self.confirms is not None:
            self.conn.owed_confirms.add(self)
            self.conn.schedule_flush()
        elif self.tx is not None and self.tx.committing and not self.tx.stored.outstanding:
            self.tx.stored.take_replies()
            self.tx.committing = False
            self.send(m.TxCommitOk())
            self._waiting = False
            self.conn.run_guarded(self, self._drain_backlog)

    # -- transactions ----------------------------------------------------------

    def _tx_select(self, method: m.TxSelect) -> None:
        if self.confirms is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self.send(m.TxSelectOk())

    def _tx_commit(self, method: m.TxCommit) -> None:
        """Carry out the transaction's publishes and settlements in one loop turn, so
        each shard gets them in one batch and applies them in one commit; answer
        commit-ok once every shard has stored its part."""
        if self.tx is None:
            raise AMQPError(spec.PRECONDITION_FAILED, "channel is not transactional")
        for kind, args in self.tx.take():
            if kind == PUBLISH:
                self._route(*args)
            else:
                self._settle_now(*args)
        if self.tx.stored.outstanding:
            self.tx.committing = True
            self._waiting = True  # later frames wait for commit-ok
        else:
            self.tx.stored.take_replies()
            self.send(m.TxCommitOk())

    def _tx_rollback(self, method: m.TxRollback) -> None:
        if self.tx is None:
            raise AMQPError(spec.PRECONDITION_FAILED, "channel is not transactional")
        # Acks of the rolled-back transaction leave their deliveries unacked again.
        self.unacked.restore(self.tx.rollback())
        self.send(m.TxRollbackOk())

    def send_confirms(self) -> None:
        if self.confirms is None or self.closing:
            return
        for ack, tag, multiple in self.confirms.take_replies():
            if ack:
                self.send(m.BasicAck(delivery_tag=tag, multiple=multiple))
            else:
                self.send(m.BasicNack(delivery_tag=tag, multiple=multiple, requeue=False))

    # -- teardown --------------------------------------------------------------

    def release(self) -> None:
        """The channel is going away: requeue what it holds, drop its consumers."""
        if self.closed:
            return
        self.closed = True
        self._stop_replies()
        holders = list(self.holder_ids)
        for link in self.broker.links:
            link.send(r.ReleaseHolders(holders))
        for holder in holders:
            self.broker.holders.pop(holder, None)
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

    _handlers = {
        m.ChannelFlow: _channel_flow,
        m.ChannelClose: _channel_close,
        m.ChannelCloseOk: _channel_close_ok,
        m.AccessRequest: _access_request,
        m.ExchangeDeclare: _exchange_declare,
        m.ExchangeDelete: _exchange_delete,
        m.ExchangeBind: _exchange_bind,
        m.ExchangeUnbind: _exchange_unbind,
        m.QueueDeclare: _queue_declare,
        m.QueueBind: _queue_bind,
        m.QueueUnbind: _queue_unbind,
        m.QueuePurge: _queue_purge,
        m.QueueDelete: _queue_delete,
        m.BasicQos: _basic_qos,
        m.BasicConsume: _basic_consume,
        m.BasicCancel: _basic_cancel,
        m.BasicGet: _basic_get,
        m.BasicAck: _basic_ack,
        m.BasicNack: _basic_nack,
        m.BasicReject: _basic_reject,
        m.BasicRecover: _basic_recover,
        m.BasicRecoverAsync: _basic_recover,
        m.ConfirmSelect: _confirm_select,
        m.TxSelect: _tx_select,
        m.TxCommit: _tx_commit,
        m.TxRollback: _tx_rollback,
    }


def _with_delivery_count(properties: bytes, count: int) -> bytes:
    """The properties with the x-delivery-count header quorum queues add."""
    try:
        props = decode_properties(properties)
    except PropertiesError:
        return properties
    props.headers = {**(props.headers or {}), "x-delivery-count": count}
    return encode_properties(props)


def _routing_keys(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [v.decode() if isinstance(v, bytes) else v for v in value
                if isinstance(v, (str, bytes))]
    return []


def _union(queues: list[QueueMeta], more: list[QueueMeta]) -> list[QueueMeta]:
    seen = {meta.qid for meta in queues}
    return queues + [meta for meta in more if meta.qid not in seen]


def _headers_of(properties: bytes):
    """The message headers, decoded only if a headers exchange asks for them."""
    def headers() -> dict:
        if len(properties) < 2 or not (properties[0] << 8 | properties[1]) & _HEADERS:
            return {}
        try:
            return decode_properties(properties).headers or {}
        except PropertiesError:
            return {}
    return headers


def _parse_expiration(text: str) -> int:
    """The expiration property as milliseconds, with RabbitMQ's complaints."""
    digits = text.lstrip("+-")
    sign_length = len(text) - len(digits)
    number = digits[:len(digits) - len(digits.lstrip("0123456789"))]
    if not number or sign_length > 1:
        raise AMQPError(spec.PRECONDITION_FAILED, f"invalid expiration '{text}': no_integer")
    if len(text) > sign_length + len(number):
        rest = text[sign_length + len(number):]
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"invalid expiration '{text}': {{leftover_string,\"{rest}\"}}")
    value = int(text[:sign_length + len(number)])
    if value < 0:
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"invalid expiration '{text}': {{value_negative,{value}}}")
    return value


def _not_default(name: str) -> None:
    """RabbitMQ refuses every declaration, deletion and binding of the default
    exchange, a passive declaration included."""
    if name == "":
        raise AMQPError(spec.ACCESS_REFUSED, "operation not permitted on the default exchange")


def _equivalent(arg: str, what: str, received, current) -> None:
    if received != current:
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"inequivalent arg '{arg}' for {what}: received "
                        f"'{_show(received)}' but current is '{_show(current)}'")


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
