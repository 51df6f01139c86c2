"""A channel's declarations: exchanges, queues and bindings (exchange.*, queue.*),
checked and answered as RabbitMQ does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from warren.shards import records as r
from warren.storage.queuespec import QueueSpec

from ..amqp import methods as m
from ..amqp import spec
from ..broker import rules
from ..broker.exchange import EXCHANGE, QUEUE, Exchange
from ..broker.peermessages import AskReplyConsumer, Forward
from ..errors import AMQPError, exchange_name, queue_name
from ..values import QueueMeta, server_generated_name
from . import replyto
from .ports import CONFLICT
from .state import ChannelState

if TYPE_CHECKING:
    from .ports import Broker


class Declaring:
    """Gets the channel's state, the broker port and the channel's `request`
    (send a request to a shard or a gateway, park the channel until the answer ran)."""

    __slots__ = ("state", "broker", "request", "conn")

    def __init__(self, state: ChannelState, broker: Broker, request: Callable):
        self.state = state
        self.broker = broker
        self.request = request
        self.conn = state.conn

    # -- many gateways -----------------------------------------------------------

    def forward(self, method) -> None:
        """On a gateway other than gateway 0, which alone changes the catalogue: have
        it run the declaration as if this connection were there, then answer as it
        did. Its changes to the catalogue arrive here before its answer."""
        def answered(answer) -> None:
            self.state.last_queue = answer.last_queue
            if answer.code:
                raise AMQPError(answer.code, answer.detail, answer.class_id, answer.method_id)
            if answer.frames:
                self.conn.send(answer.frames)

        conn = self.conn

        def forward(_=None) -> None:
            self.request(self.broker.leader, lambda req: Forward(
                req, conn.id, conn.user, self.state.vhost.name, self.state.number, m.encode_method(method),
                self.state.last_queue), answered)

        meta = None
        if type(method) in (m.QueueDeclare, m.QueueDelete):
            meta = self.state.vhost.queues.get(method.queue or self.state.last_queue)
        if meta is None:
            return forward()
        # Gateway 0 counts the queue's messages (declare-ok, delete-ok) by asking on
        # its own ring: this channel's publishes on ours must reach the shard first.
        self.request(self.state.link(meta), lambda req: r.QueueStatus(req, meta.qid), forward)

    def _writable(self, doing: str) -> None:
        """In a cluster, a change of the catalogue needs etcd (`doing`: "declare
        queue 'q' in vhost '/'", for the refusal's text)."""
        cluster = self.broker.cluster
        if cluster is not None and (refusal := cluster.refusal(doing)) is not None:
            raise refusal

    def _reply_seen(self, method, nowait: bool = False,
                    again: Callable[[], None] | None = None) -> None:
        """Answer a change of the catalogue once every gateway process has it, so a
        client told -ok finds the change on whichever gateway it uses next. In a
        cluster, once it is in etcd first; if another node's change to the same
        object won, the command runs `again` on the catalogue as etcd has it (a
        queue declared at once with other arguments: 406), or is answered as it
        is (the same binding made twice)."""
        cluster = self.broker.cluster
        if cluster is not None and not cluster.caught_up():
            def committed(outcome) -> None:
                if outcome is None or (outcome == CONFLICT and again is None):
                    self._reply_seen(method, nowait)
                elif outcome == CONFLICT:
                    assert again is not None
                    again()
                else:
                    raise outcome
            self.request(cluster, lambda req: None, committed)
            return
        followers = self.broker.followers
        if followers is None or followers.caught_up():
            return self.state.reply(method, nowait)
        self.request(followers, lambda req: None, lambda _: self.state.reply(method, nowait))

    # -- exchanges -------------------------------------------------------------

    def exchange_declare(self, method: m.ExchangeDeclare) -> None:
        vhost = self.state.vhost
        name = method.exchange
        if not method.passive:
            rules.check_exchange_type(method.type)
        rules.not_default(name)
        if method.passive:
            if name not in vhost.exchanges:
                raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(vhost.name, name)}")
            return self.state.reply(m.ExchangeDeclareOk(), method.nowait)
        self.state.allow("configure", "exchange", name)
        self._writable(f"declare {exchange_name(vhost.name, name)}")
        self.broker.declare_exchange(Exchange(
            vhost.name, name, method.type, method.durable, method.auto_delete, method.internal,
            method.arguments), self.state.allow)
        self._reply_seen(m.ExchangeDeclareOk(), method.nowait,
                         lambda: self.exchange_declare(method))

    def exchange_delete(self, method: m.ExchangeDelete) -> None:
        name = method.exchange
        rules.not_default(name)
        if name.startswith("amq."):  # refused even when no such exchange exists
            raise AMQPError(spec.ACCESS_REFUSED, f"deletion of system "
                            f"{exchange_name(self.state.vhost.name, name)} not allowed")
        self.state.allow("configure", "exchange", name)
        exchange = self.state.vhost.exchanges.get(name)
        if exchange is not None:
            self._writable(f"delete {exchange_name(self.state.vhost.name, name)}")
            if method.if_unused and exchange.bindings:
                raise AMQPError(spec.PRECONDITION_FAILED,
                                f"{exchange_name(self.state.vhost.name, name)} in use")
            self.broker.delete_exchange(exchange)
        self._reply_seen(m.ExchangeDeleteOk(), method.nowait)

    def exchange_bind(self, method: m.ExchangeBind) -> None:
        self._bind(method.source, (EXCHANGE, method.destination), method.routing_key,
                   method.arguments)
        self._reply_seen(m.ExchangeBindOk(), method.nowait)

    def exchange_unbind(self, method: m.ExchangeUnbind) -> None:
        self._unbind(method.source, (EXCHANGE, method.destination), method.routing_key,
                     method.arguments)
        self._reply_seen(m.ExchangeUnbindOk(), method.nowait)

    # -- bindings --------------------------------------------------------------

    def _binding_checks(self, source: str, destination: tuple) -> None:
        """RabbitMQ's checks of a bind or unbind that come first: permissions and
        the default exchange."""
        kind, name = destination
        self.state.allow("write", kind, name)
        rules.not_default(source)
        if kind == EXCHANGE:
            rules.not_default(name)
        self.state.allow("read", "exchange", source)

    def _bind(self, source_name: str, destination: tuple, routing_key: str,
              arguments: dict) -> None:
        """Both ends must exist (404), before an exclusive queue's 405."""
        self._binding_checks(source_name, destination)
        source, target = self.broker.binding_ends(self.state.vhost.name, source_name,
                                                  destination)
        if destination[0] == QUEUE:
            self.state.link(target)  # (404 while its node is down)
            self.state.check_exclusive(target)
        self._writable(f"bind to {exchange_name(self.state.vhost.name, source_name)}")
        self.broker.bind(source, destination, routing_key, arguments)

    def _unbind(self, source_name: str, destination: tuple, routing_key: str,
                arguments: dict) -> None:
        """As in RabbitMQ 3.10, removing a binding that does not exist, or whose queue
        or exchange does not, succeeds; only an existing binding checks exclusivity."""
        self._binding_checks(source_name, destination)
        kind, name = destination
        vhost = self.state.vhost
        source = vhost.exchanges.get(source_name)
        target = (vhost.queues if kind == QUEUE else vhost.exchanges).get(name)
        if (source is None or target is None
                or not source.has_binding(destination, routing_key, arguments)):
            return
        if isinstance(target, QueueMeta):
            self.state.link(target)  # (404 while its node is down)
            self.state.check_exclusive(target)
        self._writable(f"unbind from {exchange_name(vhost.name, source_name)}")
        self.broker.unbind(source, destination, routing_key, arguments)

    # -- queues ----------------------------------------------------------------

    def queue_declare(self, method: m.QueueDeclare) -> None:
        self.broker.totals.queues_declared += 1
        vhost = self.state.vhost
        name = method.queue
        if method.passive:
            if replyto.is_reply_queue(name):
                return self._declare_reply_address(method)
            meta = self.state.queue_named(name)
            return self._queue_declare_existing(method, meta)
        server_named = name == ""
        if server_named:
            name = server_generated_name("amq.gen-")
        else:
            rules.check_queue_name(name)
        # An exclusive queue dies with its connection: RabbitMQ ignores durable for it.
        queue = QueueSpec(vhost.name, name, method.durable and not method.exclusive,
                          method.exclusive, method.auto_delete, method.arguments)
        self.state.allow("configure", "queue", name)
        existing = vhost.queues.get(name)
        if existing is not None:
            if not self.state.between_leaders(existing):
                self.state.link(existing)  # 404 while its node is down, before any 406
            self.state.check_exclusive(existing, redeclared_exclusive=method.exclusive)
        else:
            self._writable(f"declare {queue_name(vhost.name, name)}")
        meta, created = self.broker.declare_queue(
            queue, self.conn if method.exclusive else None, server_named, self.state.allow)
        if not created:
            return self._queue_declare_existing(method, meta)
        self.state.last_queue = name
        self._reply_seen(m.QueueDeclareOk(queue=name, message_count=0, consumer_count=0),
                         method.nowait, lambda: self.queue_declare(method))

    def _declare_reply_address(self, method: m.QueueDeclare) -> None:
        """A passive declare of a direct reply-to address: as in RabbitMQ, it exists
        (one consumer) while the channel it names consumes, and is 404 after. An
        address of another gateway process is asked there. The pseudo-queue itself
        always exists (clients check for the feature so)."""
        address = method.queue

        def answer(consuming: bool) -> None:
            if not consuming:
                self.state.queue_named(address)  # 404, as for any queue that is not there
            self.state.reply(m.QueueDeclareOk(queue=address, message_count=0, consumer_count=1),
                        method.nowait)

        if address == replyto.REPLY_QUEUE:
            return answer(True)
        index = replyto.gateway_of(address)
        followers = self.broker.followers
        if index is None or index == self.broker.index or followers is None:
            return answer(self.broker.reply_channel(address) is not None)
        self.request(followers.at(index), lambda req: AskReplyConsumer(req, address),
                      lambda reply: answer(reply is not None and reply.consuming))

    def _queue_declare_existing(self, method: m.QueueDeclare, meta: QueueMeta) -> None:
        self.state.last_queue = meta.spec.name
        if method.nowait:
            return

        def answered(reply: r.Reply) -> None:
            if reply.refused == r.Refusal.SHARD_DOWN and self.state.between_leaders(meta):
                reply = r.Reply(0)  # its leader went meanwhile
            if reply.refused:
                raise self.state.refusal(reply.refused, meta)
            self.state.send(m.QueueDeclareOk(queue=meta.spec.name, message_count=reply.message_count,
                                       consumer_count=reply.consumer_count))

        if self.state.between_leaders(meta):
            return answered(r.Reply(0))
        self.request(self.state.link(meta), lambda req: r.QueueStatus(req, meta.qid), answered)

    def queue_bind(self, method: m.QueueBind) -> None:
        queue, routing_key = self._queue_binding(method)
        self._bind(method.exchange, (QUEUE, queue), routing_key, method.arguments)
        self._reply_seen(m.QueueBindOk(), method.nowait)

    def queue_unbind(self, method: m.QueueUnbind) -> None:
        queue, routing_key = self._queue_binding(method)
        self._unbind(method.exchange, (QUEUE, queue), routing_key, method.arguments)
        self._reply_seen(m.QueueUnbindOk())

    def _queue_binding(self, method: m.QueueBind | m.QueueUnbind) -> tuple[str, str]:
        """The queue and routing key of a queue.bind or unbind. With neither given,
        both are the channel's last declared queue (RabbitMQ's shortcut)."""
        queue = self.state.expand_queue_name(method.queue)
        if not method.queue and not method.routing_key:
            return queue, queue
        return queue, method.routing_key

    def queue_purge(self, method: m.QueuePurge) -> None:
        meta = self.state.queue_named(method.queue)
        self.state.allow("read", "queue", meta.spec.name)
        if meta.spec.queue_type == "stream":
            raise AMQPError(spec.NOT_IMPLEMENTED, "queue.purge not supported by stream queues "
                            f"{queue_name(meta.spec.vhost, meta.spec.name)}")

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                raise self.state.refusal(reply.refused, meta)
            self.state.reply(m.QueuePurgeOk(message_count=reply.message_count), method.nowait)

        self.request(self.state.link(meta), lambda req: r.PurgeQueue(req, meta.qid), answered)

    def queue_delete(self, method: m.QueueDelete) -> None:
        name = self.state.expand_queue_name(method.queue)
        meta = self.state.vhost.queues.get(name)
        if meta is None:
            # Deleting a queue that does not exist succeeds, as in RabbitMQ.
            return self.state.reply(m.QueueDeleteOk(message_count=0), method.nowait)
        self.state.check_exclusive(meta)
        self.state.allow("configure", "queue", meta.spec.name)
        self._writable(f"delete {queue_name(meta.spec.vhost, meta.spec.name)}")

        def answered(reply: r.Reply) -> None:
            if reply.refused:
                raise self.state.refusal(reply.refused, meta)
            self.broker.forget_queue(meta)
            self._reply_seen(m.QueueDeleteOk(message_count=reply.message_count), method.nowait)

        self.request(self.state.link(meta),
                      lambda req: r.DeleteQueue(req, meta.qid, method.if_unused, method.if_empty),
                      answered)

