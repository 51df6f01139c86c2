"""Records carried over the gateway<->shard rings.

Every ring record is one msgpack array holding a batch of these structs, so a
loop turn's work for a shard costs one encode, one ring write and one doorbell
(batches.py). Structs are `array_like` (positional, no field names on the wire)
and tagged with a small integer so a batch can mix kinds.

Identifiers chosen by the gateway:
* `qid`     a queue's id, unique for the broker's data directory.
* `holder`  who holds checked-out messages: a consumer id, or a channel's id
            for messages taken with basic.get. Both come from one counter, so
            they never collide.
* `req`     request id for commands that expect a `Reply`.

A shard serves several gateway processes, each over its own pair of rings.
Channel and holder ids name the gateway that made them (`gateway_of`), so a
shard sends deliveries and confirms to the gateway whose consumer or channel
they are for, whichever gateway's command caused them; ids stay unique across
gateways without any coordination. A request id needs no such mark: the reply
goes back on the ring the request came in on.
"""

from __future__ import annotations

import enum

import msgspec

from warren.storage.queuespec import QueueSpec

from .logsetup import LogSettings
from .ring import RingSpec


class _Record(msgspec.Struct, array_like=True, tag=True, omit_defaults=False):
    pass


# --- how the gateway starts a shard process ----------------------------------

MAX_GATEWAYS = 64  # gateway processes a broker can have: ids are n * MAX_GATEWAYS + gateway


def gateway_of(ident: int) -> int:
    """The gateway that made a channel or holder id."""
    return ident % MAX_GATEWAYS


class RingPair(msgspec.Struct, array_like=True):
    """One gateway's rings to a shard."""

    commands: RingSpec  # gateway -> shard; every gateway's share one data doorbell
    events: RingSpec  # shard -> gateway


class ShardSpec(msgspec.Struct):
    index: int
    data_dir: str
    gateways: list[RingPair]  # by gateway index
    lifeline_fd: int  # read end of a pipe the gateway holds open; EOF = gateway gone
    stores: list[int]  # store directories DATA/shard-K to open: its own, then adopted ones
    memory_limit: int = 0  # bytes of message content in RAM before publishers are blocked
    stats_interval: float = 5.0  # seconds between statistics records in DATA/logs
    store_map_size: int = 32 << 30  # LMDB map size of each shard store
    log_dir: str = ""  # statistics logs (default DATA/logs)
    log: LogSettings = LogSettings()  # the operator log, configured as the gateway's


# --- gateway -> shard --------------------------------------------------------


class CreateQueue(_Record, tag=1):
    req: int
    qid: int
    spec: QueueSpec
    arguments: dict  # in force: the spec's combined with its policy's


class QueueStatus(_Record, tag=2):
    """Ask for message and consumer counts (queue.declare of an existing queue)."""

    req: int
    qid: int


class DeleteQueue(_Record, tag=3):
    req: int
    qid: int
    if_unused: bool
    if_empty: bool


class PurgeQueue(_Record, tag=4):
    req: int
    qid: int


class Publish(_Record, tag=5):
    """One message for one or more queues on this shard (fan-out shares the body)."""

    qids: list[int]
    exchange: str
    routing_key: str
    properties: bytes  # the publisher's raw content-header property bytes
    body: bytes
    persistent: bool
    confirm_channel: int = 0  # the publishing channel's id when it is in confirm mode
    confirm_seq: int = 0  # its publish sequence number
    expiration: int = -1  # the message's own time to live in ms (-1: none)
    priority: int = 0  # the priority property, for priority queues


class Consume(_Record, tag=6):
    req: int
    qid: int
    holder: int  # the consumer id
    channel: int  # the channel's id: where deliveries go, and the exclusivity owner
    tag: str
    no_ack: bool
    exclusive: bool
    prefetch: int  # per-consumer unacked limit, 0 = unlimited
    credit: int  # initial link credit granted by the gateway
    priority: int = 0
    timeout_ms: int = 0  # consumer timeout (quorum queues and streams; 0: none)
    # A stream consumer's start: "first" | "last" | "next" | "offset" | "timestamp"
    # ("" for other queues), and the offset or the time in ms it names.
    stream_from: str = ""
    stream_at: int = 0


class Cancel(_Record, tag=7):
    req: int
    qid: int
    holder: int


class Get(_Record, tag=8):
    req: int
    qid: int
    holder: int  # the channel's id
    no_ack: bool


class Settle(_Record, tag=9):
    """Settle checked-out messages: ack, or return them (requeue) or drop them."""

    qid: int
    holder: int
    seqs: list[int]
    outcome: int  # one of SETTLE_*


SETTLE_ACK = 0
SETTLE_REQUEUE = 1  # a failed delivery (reject/recover): counts in x-delivery-count
SETTLE_DISCARD = 2
SETTLE_RETURN = 3  # nack with requeue: back to the queue, not counted as failed


class Renew(_Record, tag=16):
    """Extend the locks (consumer timeout) of these checked-out messages."""

    qid: int
    holder: int
    seqs: list[int]  # empty: every message the holder has


class Grant(_Record, tag=10):
    """Top up a consumer's link credit (flow control and channel-wide prefetch);
    with `reset`, replace it (the channel's limit changed)."""

    qid: int
    holder: int
    credit: int
    reset: bool = False


class ReleaseHolders(_Record, tag=11):
    """A channel closed: cancel its consumers and requeue everything they hold."""

    holders: list[int]


class ConfigureQueue(_Record, tag=14):
    """A queue's effective arguments changed (a policy applies to it now)."""

    qid: int
    arguments: dict


class QueueInfo(_Record, tag=15):
    """Ask for the figures of these queues (all of the shard's when empty):
    answered with QueueInfoReply."""

    req: int
    qids: list[int]


class GatewayLost(_Record, tag=17):
    """Gateway 0, which supervises the others: gateway `gateway` died. Its holders
    are released as a channel close does, what waits for it is dropped and its
    rings are reset for the gateway that replaces it."""

    req: int
    gateway: int


class Sync(_Record, tag=18):
    """Answered (Reply) once the shard has worked through everything sent before
    it on this ring: a gateway's barrier where another gateway's ring, which the
    shard may read first, carries what must come after."""

    req: int


# --- replicated quorum queues (shards/replicas.py) ---------------------------

ROLE_NONE = 0
ROLE_FOLLOWER = 1
ROLE_LEADER = 2


class ReplicaRole(_Record, tag=19):
    """The root: this shard's node (`me`) is the replica group's leader of `epoch`
    (etcd's), a follower, or neither; `members` and `in_sync` as etcd holds them.
    Sent again when the link to the leader reconnects: a follower says hello."""

    qid: int
    role: int  # ROLE_*
    epoch: int
    members: list[str]
    in_sync: list[str]
    me: str


class ReplicaFrame(_Record, tag=20):
    """A replication message for a group's shard on another node, carried unread:
    as a command, one from node `node`; as an event, one to node `node`."""

    qid: int
    node: str
    payload: bytes  # msgpack of one of shards/replicas.py's frames


class InSyncWritten(_Record, tag=21):
    """The root wrote (`ok`) or failed to write the in-sync set an InSyncProposal
    asked for; `nodes` is what etcd holds now."""

    qid: int
    epoch: int
    nodes: list[str]
    ok: bool


class Stop(_Record, tag=13):
    """Finish pending work, commit, and exit."""


# --- shard -> gateway --------------------------------------------------------


class Refusal(enum.IntEnum):
    """Why a shard turned a request down (NONE: it did not). The gateway words each
    as RabbitMQ does (gateway/errors.py); the shard speaks no AMQP."""

    NONE = 0
    NO_QUEUE = 1  # the queue went away meanwhile
    EXCLUSIVE_USE = 2  # basic.consume: a consumer holds the queue exclusively
    IN_USE = 3  # queue.delete if-unused: it has consumers
    NOT_EMPTY = 4  # queue.delete if-empty: it holds messages
    FAILED = 5  # handling the request failed (logged by the shard)
    SHARD_DOWN = 6  # no shard process to answer


class Reply(_Record, tag=50):
    """Answer to a request; `refused` says why it was turned down (a Refusal)."""

    req: int
    refused: int = Refusal.NONE
    message_count: int = 0
    consumer_count: int = 0


class Deliver(_Record, tag=51):
    holder: int  # consumer id
    qid: int
    seq: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    delivery_count: int = 0  # failed deliveries so far (quorum queues): x-delivery-count


class GetReply(_Record, tag=52):
    """basic.get answer; seq 0 means the queue was empty (basic.get-empty)."""

    req: int
    qid: int
    seq: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""
    properties: bytes = b""
    body: bytes = b""
    message_count: int = 0
    refused: int = Refusal.NONE
    delivery_count: int = 0


class QueueInfoReply(_Record, tag=59):
    """Per queue: [qid, ready, unacked, consumers, ready_bytes, published,
    delivered, redelivered, acked, rejected, expired, dead_lettered]."""

    req: int
    queues: list[list[int]]
    fsyncs: int = 0  # the shard's commits so far
    messages: int = 0  # records written by them
    followed: list[int] = []  # asked for all: the replicated queues it follows (no row)


# A stream's row adds its log's segments and bytes on disk, then (consumer id,
# offset it reads next) for each of its consumers (shards/streams.py). A replicated
# queue's row on its leader's shard adds the two as 0, then its epoch, its commit
# index and each member's index, members in sorted order (replication.Leader.status).
QUEUE_INFO_FIELDS = ("qid", "ready", "unacked", "consumers", "ram_bytes", "published",
                     "delivered", "redelivered", "acked", "rejected", "expired", "dead_lettered",
                     "segments", "disk_bytes")


class ConsumerCancelled(_Record, tag=53):
    """The shard ended a consumer (its queue was deleted)."""

    holder: int
    qid: int


class Confirmed(_Record, tag=54):
    """Publishes that every target queue on this shard accepted (parallel lists)."""

    channels: list[int]
    seqs: list[int]


class Rejected(_Record, tag=56):
    """Publishes this shard could not store (its store is full): nack them."""

    channels: list[int]
    seqs: list[int]


class Alarm(_Record, tag=57):
    """A shard's resource alarm went on or off: 'memory' (transient bodies over
    the watermark) or 'disk' (its store is full)."""

    resource: str
    active: bool


class DeadLettered(_Record, tag=58):
    """A message left a queue that has a dead-letter exchange: rejected without
    requeue, expired, or dropped by its length limit ('rejected', 'expired',
    'maxlen'). The gateway republishes it there with its x-death history."""

    qid: int
    seq: int
    reason: str
    exchange: str | None
    routing_key: str | None
    properties: bytes | None
    body: bytes | None


class ConsumerTimedOut(_Record, tag=60):
    """A consumer kept these messages past its timeout: they are back in the queue
    and the consumer gets nothing new until they are settled or it is cancelled."""

    holder: int
    qid: int
    seqs: list[int]
    timeout_ms: int


class QueueDeleted(_Record, tag=55):
    """The shard deleted a queue by itself (auto-delete after the last consumer)."""

    qid: int


# Credit of a connection towards one shard, in units of shard work (chosen by
# measurement, see docs/architecture.md): enough to keep a shard busy across a loop
# turn, little enough that a consumer's ack behind it waits milliseconds, not
# seconds. A persistent publish costs the shard a write, a commit and a read back
# on delivery, so it spends more. The gateway spends it; Progress returns it.
PUBLISH_CREDIT = 150
PERSISTENT_COST = 3


def credit_cost(cmd) -> int:
    """The credit a command spent: a publish's (others spend none)."""
    if type(cmd) is not Publish:
        return 0
    return PERSISTENT_COST if cmd.persistent else 1


class Progress(_Record, tag=61):
    """The shard has worked through this many command ring records since it started;
    the gateway credits the publishes in them back to their connections."""

    records: int


class PublishCost(_Record, tag=62):
    """What a publish into this queue now spends of its connection's credit, as a
    multiple of its own cost (credit_cost): above 1 while the queue's consumers
    are behind, so its publishers slow towards their pace; 1 once they catch up."""

    qid: int
    cost: int


class InSyncProposal(_Record, tag=63):
    """A leader's wish for its group's in-sync set: the root writes it to etcd,
    fenced by `epoch`, and answers with InSyncWritten."""

    qid: int
    epoch: int
    nodes: list[str]


Command = (
    CreateQueue | QueueStatus | DeleteQueue | PurgeQueue | Publish | Consume | Cancel
    | Get | Settle | Grant | ReleaseHolders | Stop | ConfigureQueue | QueueInfo | Renew
    | GatewayLost | Sync | ReplicaRole | ReplicaFrame | InSyncWritten
)
Event = (Reply | Deliver | GetReply | ConsumerCancelled | Confirmed | Rejected | QueueDeleted
         | Alarm | DeadLettered | QueueInfoReply | ConsumerTimedOut | Progress | PublishCost
         | ReplicaFrame | InSyncProposal)
