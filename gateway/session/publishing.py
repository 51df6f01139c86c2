"""A channel's publishing: basic.publish routed to the shards of its queues,
the properties the broker acts on (expiration, priority, CC/BCC, direct reply-to),
unroutable returns, lock renewal, publisher confirms and transactions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from warren.shards import records as r

from ..amqp import frames, hotpath, spec
from ..amqp import methods as m
from ..amqp.properties import (
    BasicProperties,
    PropertiesError,
    decode_properties,
    encode_properties,
    flag_mask,
    peek_delivery_mode,
    peek_expiration,
    peek_priority,
    peek_reply_to,
)
from ..broker.exchange import RENEW_EXCHANGE
from ..errors import AMQPError, exchange_name
from ..values import QueueMeta, by_shard
from . import replyto
from .assembly import BASIC_CLASS
from .confirms import ConfirmTracker
from .state import ChannelState
from .transaction import Transaction, TxPublish

if TYPE_CHECKING:
    from .ports import Broker

_EXPIRATION = flag_mask("expiration")
_PRIORITY = flag_mask("priority")
_REPLY_TO = flag_mask("reply_to")
_HEADERS = flag_mask("headers")
_EXTRAS = _EXPIRATION | _PRIORITY | _REPLY_TO | _HEADERS
# What a mandatory reply to another gateway's reply-to address waits for before its
# confirm, in place of a shard: that gateway's word (ReplyOutcome).
REMOTE_REPLY = -1


_DELIVERY_MODE = flag_mask("delivery_mode")
# Properties stored before delivery_mode, and the continuation bit of a second flag word.
_BEFORE_DELIVERY_MODE = (flag_mask("content_type") | flag_mask("content_encoding") | _HEADERS
                         | 1)
_LOOK_UP = object()  # _route's default: find the exchange by name
# Routes a connection remembers (see Route), a few hundred bytes each at most; a
# publisher that keeps changing its routing key starts again from none when it has
# this many.
ROUTES_KEPT = 256


class Route:
    """Where a publish went, kept by its connection under the publish's method
    payload (exchange, routing key, flags): the next one like it on any of its
    channels, with no property the broker acts on, goes to the same queues without
    the lookups and checks (handle_publish). Valid while the catalogue and the
    permissions stay as they were (Gateway.epoch); shards by index, as a restarted
    shard gets a new link."""

    __slots__ = ("epoch", "exchange", "routing_key", "sends", "shards")

    def __init__(self, epoch: int, exchange: str, routing_key: str, targets: list[QueueMeta]):
        self.epoch = epoch
        self.exchange = exchange
        self.routing_key = routing_key
        self.sends = by_shard(targets)  # (shard, qids): one record each; () drops it
        self.shards = tuple(shard for shard, _ in self.sends)  # a confirm waits for these


def _persistent(properties: bytes) -> bool:
    """delivery_mode == 2. Read in place when it is the first property present (what
    most clients send); raises PropertiesError as peek_delivery_mode does."""
    flags = properties[0] << 8 | properties[1]
    if not flags & _BEFORE_DELIVERY_MODE and len(properties) > 2:
        return bool(flags & _DELIVERY_MODE) and properties[2] == 2
    return peek_delivery_mode(properties) == 2


class Publishing:
    """Gets the channel's state, the broker port, the channel's `command` (run or
    queue a complete command in its turn), consuming's `settle_now` (a committed
    transaction's settlements) and the channel's `drain_backlog` (commit-ok lets
    the waiting commands run). What a publish touches is bound here once."""

    __slots__ = ("state", "broker", "command", "settle_now", "drain_backlog", "conn", "number",
                 "id", "routes", "assembler", "totals", "unacked", "publish_to")

    def __init__(self, state: ChannelState, broker: Broker, command: Callable,
                 settle_now: Callable, drain_backlog: Callable):
        self.state = state
        self.broker = broker
        self.command = command
        self.settle_now = settle_now
        self.drain_backlog = drain_backlog
        self.conn = state.conn
        self.number = state.number
        self.id = state.id
        self.routes = state._routes
        self.assembler = state.assembler
        self.totals = broker.totals
        self.unacked = state.unacked
        self.publish_to = broker.publish_to

    # -- basic: publish and confirms -------------------------------------------

    def handle_publish(self, payload: bytes, properties: bytes, body: bytes) -> None:
        """A whole publish (method payload, properties, body) arrived at once. One
        whose route its connection knows goes straight to its shards: what publish
        and _route would do for it outside a transaction, with no expiration,
        priority, reply-to or headers. (Under a resource alarm its connection stops
        before a publish's content header: Connection._block.)"""
        route = self.routes.get(payload)
        state = self.state
        if (route is not None and route.epoch == self.broker.epoch and state.tx is None
                and not state._waiting and not (properties[0] << 8 | properties[1]) & _EXTRAS
                and len(body) <= self.assembler.max_size):
            try:
                persistent = _persistent(properties)
            except PropertiesError:
                persistent = None  # _route says what is wrong with them
            if persistent is not None:
                totals = self.totals
                totals.received += 1
                tracker = state.confirms
                if tracker is None:
                    channel = seq = 0
                else:
                    channel, seq = self.id, tracker.publish(route.shards)
                    totals.received_confirm += 1
                if route.sends:
                    totals.routed += 1
                    self.publish_to(route.sends, route.exchange, route.routing_key,
                                    properties, body, persistent, -1, 0, channel, seq,
                                    tracker, self.conn)
                else:
                    totals.unroutable_dropped += 1
                if tracker is not None and tracker.has_answers():
                    self._confirms_changed()
                return
        method, properties, body = self.assembler.whole_publish(payload, properties, body)
        if state._waiting or type(method) is AMQPError:
            self.command(method, properties, body)
        else:  # what command and _execute would do, without the two calls
            self.publish(method, properties, body, payload)

    def publish(self, method: hotpath.Publish, properties: bytes, body: bytes,
                payload: bytes | None = None) -> None:
        """`payload`: the method's, under which the connection may remember its route."""
        if method.immediate:
            raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true",
                            method.CLASS_ID, method.METHOD_ID)
        vhost = self.state.vhost
        exchange = vhost.exchanges.get(method.exchange)
        if exchange is None:
            raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(vhost.name, method.exchange)}",
                            method.CLASS_ID, method.METHOD_ID)
        try:
            self.broker.access.check(self.conn.user, vhost.name, "write", "exchange",
                                     exchange.name)
        except AMQPError as error:  # RabbitMQ names basic.publish in the close
            error.class_id, error.method_id = method.CLASS_ID, method.METHOD_ID
            raise
        if exchange.internal:
            raise AMQPError(spec.ACCESS_REFUSED,
                            f"cannot publish to internal {exchange_name(vhost.name, exchange.name)}",
                            method.CLASS_ID, method.METHOD_ID)
        if exchange.name == RENEW_EXCHANGE:
            return self._renew(method.routing_key, properties)
        expiration, priority, also = -1, 0, ()
        if (properties[0] << 8 | properties[1]) & _EXTRAS:  # a header holds 2 flag bytes
            try:
                expiration, priority, also, properties = self._read_extras(properties)
            except AMQPError as error:
                error.class_id, error.method_id = method.CLASS_ID, method.METHOD_ID
                raise
            payload = None  # a route for these properties alone
        if self.state.tx is not None:
            self.state.tx.publish(TxPublish(method, properties, body, expiration, priority, also))
        else:
            self._route(method, properties, body, expiration, priority, also, exchange, payload)

    def _renew(self, consumer_tag: str, properties: bytes) -> None:
        """Warren's lock renewal: a publish to amq.warren.renew with the consumer tag
        as routing key and header x-delivery-tag (or x-renew-all = true) extends the
        lock of those deliveries by the consumer's timeout."""
        consumer = self.state.consumers.get(consumer_tag)
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
                expiration = _parse_expiration(
                    peek_expiration(properties))  # type: ignore[arg-type]  # its flag is set
            priority = peek_priority(properties) or 0 if flags & _PRIORITY else 0
            props: BasicProperties | None = None
            changed: BasicProperties | None = None  # props, when they are to be re-encoded
            if flags & _HEADERS:
                props = decode_properties(properties)
                headers = props.headers or {}
                also = tuple(_routing_keys(headers.get("CC")) + _routing_keys(headers.get("BCC")))
                if "BCC" in headers:
                    props.headers = {k: v for k, v in headers.items() if k != "BCC"}
                    changed = props
            if flags & _REPLY_TO and peek_reply_to(properties) == replyto.REPLY_QUEUE:
                if self.state.reply_consumer is None:
                    raise AMQPError(spec.PRECONDITION_FAILED, "fast reply consumer does not exist")
                props = props or decode_properties(properties)
                props.reply_to = self.state.reply_address
                changed = props
            if changed is not None:
                properties = encode_properties(changed)
        except PropertiesError as error:
            raise AMQPError(spec.SYNTAX_ERROR, f"malformed content properties: {error}") from None
        return expiration, priority, also, properties

    def _route(self, method: hotpath.Publish, properties: bytes, body: bytes,
               expiration: int = -1, priority: int = 0, also: tuple = (),
               exchange=_LOOK_UP, payload: bytes | None = None) -> None:
        """Send a message to the shards of every queue it routes to, in one record each.
        `exchange` is looked up unless the caller just did (a transaction's publish
        routes at commit, through the exchanges as they are then). With `payload`,
        the route is remembered for the publishes like this one (Route)."""
        vhost = self.state.vhost
        if exchange is _LOOK_UP:
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
        if self.broker.down_shards and targets:
            # A queue on a node that is down counts as no route, as in RabbitMQ; a
            # remembered route is made again when a node goes or comes (epoch). A
            # quorum queue's stays: the publish is nacked, never acked as unroutable
            # while its leader is away (it may be replicated elsewhere).
            down = self.broker.down_shards
            targets = [meta for meta in targets
                       if meta.shard not in down or meta.spec.queue_type == "quorum"]
        try:
            persistent = _persistent(properties)
        except PropertiesError as error:
            raise AMQPError(spec.SYNTAX_ERROR, f"malformed content properties: {error}",
                            method.CLASS_ID, method.METHOD_ID) from None
        if tracker is None:
            seq = 0
        else:
            seq = tracker.publish((targets[0].shard,) if len(targets) == 1
                                  else {meta.shard for meta in targets})
        totals = self.totals
        totals.received += 1
        if seq:
            totals.received_confirm += 1
        if not targets:
            if method.mandatory:
                totals.unroutable_returned += 1
                self._return_unroutable(method, properties, body)
            else:
                totals.unroutable_dropped += 1
        else:
            totals.routed += 1
            self.broker.publish(targets, method.exchange, routing_key, properties, body,
                                persistent, expiration, priority,
                                self.id if seq else 0, seq, tracker if seq else None, self.conn)
        if payload is not None and (targets or not method.mandatory):  # (never in a tx)
            if len(self.routes) >= ROUTES_KEPT:
                self.routes.clear()
            self.routes[payload] = Route(self.broker.epoch, method.exchange, routing_key,
                                         targets)
        if tracker is not None and (tracker is not self.state.confirms or tracker.has_answers()):
            self._confirms_changed()  # (a confirm waiting for its shards changes nothing yet)

    def _route_reply(self, method: hotpath.Publish, properties: bytes, body: bytes,
                     tracker) -> None:
        """A reply to a direct reply-to address: straight to that channel, or, for
        another gateway's address, to that gateway. A mandatory reply whose
        requester has gone comes back (basic.return), before its confirm: one sent
        to another gateway is confirmed once that gateway says what became of it."""
        channel = self.broker.reply_channel(method.routing_key)
        if channel is not None:
            self._confirm_at_once(tracker)
            channel.deliver_reply(method.exchange, method.routing_key, properties, body)
            return
        if not method.mandatory:
            self._confirm_at_once(tracker)
            self.broker.reply_elsewhere(method.exchange, method.routing_key, properties, body)
            return
        self.state.replies_asked += 1
        ask = self.state.replies_asked
        if self.broker.reply_elsewhere(method.exchange, method.routing_key, properties, body,
                                        self.id, ask):
            seq = tracker.publish((REMOTE_REPLY,)) if tracker is not None else 0
            self.state.remote_replies[ask] = (method, properties, body, seq)
            return
        self._confirm_at_once(tracker)
        self._return_unroutable(method, properties, body)

    def reply_outcome(self, ask: int, returned: bool) -> None:
        """Another gateway delivered (or, its requester gone, returns) a mandatory reply."""
        pending = self.state.remote_replies.pop(ask, None)
        if pending is None or self.state.closing or self.state.closed:
            return
        method, properties, body, seq = pending
        if returned:
            self._return_unroutable(method, properties, body)
            self.conn.schedule_flush()
        if seq:
            self.confirmed([seq], REMOTE_REPLY)

    def _return_unroutable(self, method: hotpath.Publish, properties: bytes, body: bytes) -> None:
        self.conn.send(frames.content_frames(
            self.number,
            m.encode_method(m.BasicReturn(reply_code=spec.NO_ROUTE, reply_text="NO_ROUTE",
                                          exchange=method.exchange,
                                          routing_key=method.routing_key)),
            BASIC_CLASS, properties, body, self.conn.frame_max))

    def deliver_reply(self, exchange: str, routing_key: str, properties: bytes,
                      body: bytes) -> None:
        if self.state.reply_consumer is None or self.state.closing or self.state.closed:
            return
        tag = self.state.next_tag
        self.state.next_tag += 1
        self.conn.send(frames.content_frames(
            self.number,
            hotpath.deliver_payload(hotpath.shortstr(self.state.reply_consumer), tag, False, exchange,
                                    routing_key),
            BASIC_CLASS, properties, body, self.conn.frame_max))
        self.conn.schedule_flush()

    def confirm_select(self, method: m.ConfirmSelect) -> None:
        if self.state.tx is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.state.confirms is None:
            self.state.confirms = ConfirmTracker()
        self.state.reply(m.ConfirmSelectOk(), method.nowait)

    def _tracker(self) -> ConfirmTracker | None:
        """Who counts the shards' acceptance of publishes: confirm mode's tracker,
        or a transaction's (commit-ok waits for it)."""
        if self.state.confirms is not None:
            return self.state.confirms
        return self.state.tx.stored if self.state.tx is not None else None

    def confirmed(self, seqs: list[int], shard: int) -> None:
        """The shard stored these publishes of this channel."""
        tracker = self._tracker()
        if tracker is None or self.state.closing:
            return
        if tracker is self.state.confirms:  # answers go out at the flush: one change for all
            for seq in seqs:
                tracker.accept(seq, shard)
            self._confirms_changed()
            return
        for seq in seqs:  # a transaction's: commit-ok as soon as the last is stored
            tracker.accept(seq, shard)
            self._confirms_changed()

    def rejected(self, seqs: list[int], shard: int) -> None:
        """The shard could not store these publishes of this channel."""
        tracker = self._tracker()
        if tracker is not None and not self.state.closing:
            for seq in seqs:
                tracker.reject(seq, shard)
                self._confirms_changed()

    def _confirms_changed(self) -> None:
        if self.state.confirms is not None:
            self.conn.owed_confirms.add(self)
            self.conn.schedule_flush()
        elif self.state.tx is not None and self.state.tx.stored_all():
            self.state.send(m.TxCommitOk())
            self.state._waiting = False
            self.conn.run_guarded(self.state, self.drain_backlog)

    # -- transactions ----------------------------------------------------------

    def tx_select(self, method: m.TxSelect) -> None:
        if self.state.confirms is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.state.tx is None:
            self.state.tx = Transaction()
        self.state.send(m.TxSelectOk())

    def tx_commit(self, method: m.TxCommit) -> None:
        """Carry out the transaction's publishes and settlements in one loop turn, so
        each shard gets them in one batch and applies them in one commit; answer
        commit-ok once every shard has stored its part."""
        if self.state.tx is None:
            raise AMQPError(spec.PRECONDITION_FAILED, "channel is not transactional")
        for action in self.state.tx.take():
            if isinstance(action, TxPublish):
                self._route(*action)
            else:
                self.settle_now(action.taken, action.outcome)
        if self.state.tx.carried_out():
            self.state.send(m.TxCommitOk())
        else:
            self.state._waiting = True  # later frames wait for commit-ok

    def tx_rollback(self, method: m.TxRollback) -> None:
        if self.state.tx is None:
            raise AMQPError(spec.PRECONDITION_FAILED, "channel is not transactional")
        # Acks of the rolled-back transaction leave their deliveries unacked again.
        self.unacked.restore(self.state.tx.rollback())
        self.state.send(m.TxRollbackOk())

    def send_confirms(self) -> None:
        if self.state.confirms is None or self.state.closing:
            return
        acked = self.state.confirms.acked
        replies = self.state.confirms.take_replies()
        self.totals.confirmed += self.state.confirms.acked - acked
        for ack, tag, multiple in replies:
            if ack:
                self.conn.send(hotpath.ack_frame(self.number, tag, multiple))
            else:
                self.state.send(m.BasicNack(delivery_tag=tag, multiple=multiple, requeue=False))


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
