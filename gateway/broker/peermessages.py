"""The messages gateway processes exchange (node/controllink.py carries them):
gateway 0 sends the catalogue's changes (`Changes`, answered with `Applied`) and
the answers to declarations; another gateway forwards its clients' declarations
(`Forward`, answered with `Answer`), says when a connection that declared through
it has closed, shows its connections to the management API (`Connections`,
`CloseConnection`) and asks the broker's login throttle about failed logins
(`LoginFailed`, `LoginTurn`). The root hands a gateway clients' sockets and
restarted shards' rings (`Handed`)."""

from __future__ import annotations

from typing import Union

import msgspec

from warren.shards import records as r

from ..snapshots import ConnectionInfo
from .changes import Change


class _Message(msgspec.Struct, array_like=True, tag=True):
    pass


class Serving(_Message, tag=1):
    """A gateway accepts connections now (sent once it has the catalogue)."""

    gateway: int


class Changes(_Message, tag=2):
    seq: int  # the last change's number: changes are numbered from 1, broker-wide
    changes: list[Change]


class Applied(_Message, tag=3):
    seq: int


class Forward(_Message, tag=4):
    """A client's declaration (exchange.*, queue.* but purge), for gateway 0 to run
    as if its connection were there."""

    req: int
    connection: int  # the connection's id (exclusive queues' owner)
    user: str
    vhost: str
    channel: int  # the channel's number
    method: bytes  # the method frame's payload
    last_queue: str  # the channel's last declared queue ("" in queue.bind means it)


class Answer(_Message, tag=5):
    req: int
    frames: bytes = b""  # the reply frames to send the client (none for nowait)
    last_queue: str = ""
    code: int = 0  # an error's reply code (0: no error) ...
    detail: str = ""  # ... its text (after the code's name) and the method it names
    class_id: int = 0
    method_id: int = 0


class ConnectionClosed(_Message, tag=6):
    connection: int


class ListConnections(_Message, tag=10):
    """Gateway 0 asks for another gateway's connections (a management request)."""


class Connections(_Message, tag=7):
    """Another gateway's connections as they are now, for the management API and
    the metrics."""

    ids: list[int]
    infos: list[ConnectionInfo]
    totals: dict[str, int]  # its Totals since it started


class CloseConnection(_Message, tag=8):
    """Close a connection (the management API's DELETE), 320 with `reason`."""

    connection: int
    reason: str


class Reply(_Message, tag=9):
    """A reply published on one gateway to a direct reply-to address of another
    (`gateway`): gateway 0 passes it on, the other delivers it. A mandatory one
    names its publisher's channel (`origin`, with its number for it, `ask`),
    which hears back whether it was delivered (`ReplyOutcome`)."""

    gateway: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    origin: int = 0
    ask: int = 0


class ReplyOutcome(_Message, tag=16):
    """Was a mandatory Reply delivered? `returned`: its requester had gone."""

    origin: int
    ask: int
    returned: bool


class Admit(_Message, tag=11):
    """May a connection open (channels 0), or open its `channels`th channel? Gateway 0
    counts it against the vhost's and user's limits over every gateway, and holds
    the count until ConnectionClosed; answered with `Admitted`."""

    req: int
    connection: int
    user: str
    vhost: str
    channels: int


class Admitted(_Message, tag=12):
    req: int
    refusal: str = ""  # why not ("": admitted)


class ChannelCount(_Message, tag=13):
    """A connection's channels now (for the limits gateway 0 counts)."""

    connection: int
    channels: int


class AskReplyConsumer(_Message, tag=14):
    """Gateway 0 asks the gateway a direct reply-to address names whether its
    channel still consumes (a passive queue.declare of the address); answered
    with `ReplyConsumer`."""

    req: int
    address: str


class ReplyConsumer(_Message, tag=15):
    req: int
    consuming: bool


class LoginTurn(_Message, tag=20):
    """A login from an address the root throttles: when may its password be
    checked? Answered with `LoginWait`."""

    req: int
    address: str


class LoginFailed(_Message, tag=21):
    """A refused login, for the root's throttle to count; answered with `LoginWait`
    (how long to delay the refusal). `at_turn`: it waited its turn."""

    req: int
    address: str
    at_turn: bool


class LoginWait(_Message, tag=22):
    req: int
    wait: float  # seconds; -1: refuse the login unchecked
    throttled: bool  # the root throttles the address (now)


class ClusterView(_Message, tag=23):
    """In a cluster, what a gateway needs to reach other nodes' shards
    (cluster/peers.py): this node, the link's secret, every node met (name, link
    address, shards, number), which run, and what each shard index past this node's own
    stands for (node, shard there), in the root's order."""

    node: str
    number: int
    secret: bytes
    nodes: list[tuple[str, str, int, int]]
    running: list[str]
    remote: list[tuple[str, int]]


Message = Union[Admit, Admitted, ChannelCount, Serving, Changes, Applied, Forward, Answer,
                ConnectionClosed, ListConnections, Connections, CloseConnection, Reply,
                AskReplyConsumer, ReplyConsumer, ReplyOutcome, LoginTurn, LoginFailed,
                LoginWait, ClusterView]
decode_message = msgspec.msgpack.Decoder(Message).decode
encode = msgspec.msgpack.Encoder().encode


class ShardDown(_Message, tag=17):
    """A shard died: the gateway drops what it had there (as the root does for
    its own clients) until the restarted shard's rings come."""

    shard: int


class ShardRings(_Message, tag=18):
    """A restarted shard's rings for the gateway; their four doorbells come with
    the message (SCM_RIGHTS), in the order `ring_fds` lists them."""

    shard: int
    rings: r.RingPair


class Client(_Message, tag=19):
    """A client's TCP connection, accepted by the root: its socket comes with the
    message; `tls`: it came to the AMQPS port."""

    tls: bool


Handed = Union[ShardDown, ShardRings, Client]
decode_handed = msgspec.msgpack.Decoder(Handed).decode
