"""A channel's state, every attribute declared here with its type, and the lookups
its handlers share (channel.py dispatches, declaring.py, consuming.py and
publishing.py handle). The handlers get this state, and the broker port, at
construction: they share no self."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from warren.shards.records import Refusal

from ..amqp import frames, hotpath, spec
from ..errors import AMQPError, home_node_down, queue_name, refusal_error
from ..values import QueueMeta
from . import prefetch
from .assembly import Assembler
from .unacked import Unacked

if TYPE_CHECKING:
    from ..broker.catalogue import VHost
    from .confirms import ConfirmTracker
    from .ports import Broker, Client, Shard
    from .transaction import Transaction


class ConsumerState:
    """The gateway's side of a consumer. Credit is handed out in one of two modes:

    * window: consuming.FLOW_WINDOW credit, returned in chunks as deliveries leave
      through the socket (no-ack consumers, and every consumer of a channel without
      a global limit);
    * limited: manual-ack consumers of a channel with basic.qos global=true share
      the channel's limit; credit comes back only as deliveries are settled, and
      credit outstanding + unacked never exceeds the limit (docs/architecture.md).
    """

    __slots__ = ("tag", "tag_shortstr", "holder", "meta", "link", "no_ack", "exclusive",
                 "prefetch", "credit", "owed_credit", "unacked", "timeout_ms", "timed_out",
                 "arguments")

    def __init__(self, tag: str, holder: int, meta: QueueMeta, link: Shard, no_ack: bool,
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

    def room(self) -> int | None:
        """Credit it could use under its own limit; None when it has none."""
        return None if self.no_ack else prefetch.room(self.prefetch, self.unacked, self.credit)


class ChannelState:
    __slots__ = (
        "conn", "number", "broker", "vhost", "id", "holder_ids", "consumers", "by_holder",
        "unacked", "consumer_unacked", "next_tag", "consumer_prefetch", "channel_prefetch",
        "confirms", "tx", "flow_active", "held_deliveries", "last_queue", "reply_consumer",
        "reply_key", "reply_address", "timed_out", "remote_replies", "replies_asked",
        "closing", "closed", "assembler", "_waiting", "backlog", "_running", "_routes")

    conn: Client
    number: int
    broker: Broker
    vhost: VHost
    id: int  # the channel's holder id: its basic.get deliveries and its confirms
    holder_ids: set[int]  # every holder this channel used, for release
    consumers: dict[str, ConsumerState]  # by consumer tag
    by_holder: dict[int, ConsumerState]
    unacked: Unacked
    consumer_unacked: int  # unacked deliveries to consumers (basic.get's excluded)
    next_tag: int  # the next delivery tag
    consumer_prefetch: int  # basic.qos global=false: each new consumer's own limit
    channel_prefetch: int  # basic.qos global=true: the channel's, 0 none
    confirms: ConfirmTracker | None  # in confirm mode
    tx: Transaction | None  # in transaction mode
    flow_active: bool
    held_deliveries: list[bytes]  # while the client has flow off
    last_queue: str  # the queue "" names (RabbitMQ's last declared queue)
    reply_consumer: str | None  # consumer tag on amq.rabbitmq.reply-to
    reply_key: str
    reply_address: str
    # consumers cancelled by a timeout, listed (status timed_out) until the client
    # settles the deliveries that timed out: tag -> (consumer, their delivery tags)
    timed_out: dict[str, tuple[ConsumerState, set[int]]]
    # mandatory replies sent to another gateway's reply-to address, until it says
    # whether they were delivered: number -> (method, properties, body, seq)
    remote_replies: dict[int, tuple]
    replies_asked: int
    closing: bool  # we sent channel.close and wait for close-ok
    closed: bool
    assembler: Assembler
    _waiting: bool  # for a shard's (or gateway 0's) answer: commands wait in the backlog
    backlog: deque
    _running: object  # the method being handled (a shard request's errors name it)
    _routes: dict  # publishing.Route memory, shared by the connection's channels

    def __init__(self, conn: Client, number: int):
        broker = conn.gateway
        self.conn = conn
        self.number = number
        self.broker = broker
        self.vhost = conn.vhost  # channels open only once the connection's vhost is set
        self.id = broker.new_id()
        self.holder_ids = {self.id}
        self.consumers = {}
        self.by_holder = {}
        self.unacked = Unacked()
        self.consumer_unacked = 0
        self.next_tag = 1
        self.consumer_prefetch = 0
        self.channel_prefetch = 0
        self.confirms = None
        self.tx = None
        self.flow_active = True
        self.held_deliveries = []
        self.last_queue = ""
        self.reply_consumer = None
        self.reply_key = ""
        self.reply_address = ""
        self.timed_out = {}
        self.remote_replies = {}
        self.replies_asked = 0
        self.closing = False
        self.closed = False
        self.assembler = Assembler(broker.config.max_message_size)
        self._waiting = False
        self.backlog = deque()
        self._running = None
        self._routes = conn.routes

    # -- output ----------------------------------------------------------------

    def send(self, method) -> None:
        self.conn.send(frames.method_frame(self.number, method))

    def reply(self, method, nowait: bool = False) -> None:
        if not nowait:
            self.send(method)

    # -- lookups ---------------------------------------------------------------

    def expand_queue_name(self, name: str) -> str:
        """A queue name as a method gives it: "" is the channel's last declared queue."""
        if name:
            return name
        if not self.last_queue:
            raise AMQPError(spec.NOT_FOUND, "no previously declared queue")
        return self.last_queue

    def queue_named(self, name: str) -> QueueMeta:
        name = self.expand_queue_name(name)
        meta = self.vhost.queues.get(name)
        if meta is None:
            raise AMQPError(spec.NOT_FOUND, f"no {queue_name(self.vhost.name, name)}")
        self.check_exclusive(meta)
        return meta

    def check_exclusive(self, meta: QueueMeta, redeclared_exclusive: bool | None = None) -> None:
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

    def allow(self, access: str, kind: str, name: str) -> None:
        """403 unless this connection's user has `access` to the resource."""
        self.broker.access.check(self.conn.user, self.vhost.name, access, kind, name)

    def refusal(self, refused: int, meta: QueueMeta) -> AMQPError:
        """A shard's refusal of a command on `meta`, in RabbitMQ's words: a queue
        whose node went out of reach meanwhile answers as one already out."""
        link = self.broker.link(meta.shard)
        if refused == Refusal.SHARD_DOWN and (node := getattr(link, "node", None)) is not None:
            return home_node_down(node, meta.spec.vhost, meta.spec.name)
        return refusal_error(refused, meta.spec.vhost, meta.spec.name)

    def between_leaders(self, meta: QueueMeta) -> bool:
        """A replicated queue whose leader is out of reach (an election, or no
        majority): RabbitMQ declares it all the same, counting nothing."""
        link = self.broker.link(meta.shard)
        return meta.spec.queue_type == "quorum" and not link.alive \
            and getattr(link, "node", None) is not None

    def link(self, meta: QueueMeta) -> Shard:
        """The queue's shard; 404 when it is on a node that is out of reach."""
        link = self.broker.link(meta.shard)
        if not link.alive and (node := getattr(link, "node", None)) is not None:
            raise home_node_down(node, meta.spec.vhost, meta.spec.name)
        return link
