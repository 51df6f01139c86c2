"""What the session needs of the world around it, as typed ports.

A channel reaches the broker only through `Broker` (io/process.Gateway is one),
a connection through `Hub` (Broker and the gateway's turn, registry and shard
links), its connection only through `Client` (session/connection.Connection, and the
stand-ins session/direct.InternalConnection and node/forwarded.Mirror), and a
shard or another gateway process only through `Peer`/`Shard`. Nothing here is
imported at run time by what implements it: the checks are structural.

Attributes are read per message on the hot path (epoch, totals); what changes the
broker's state is a method.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterator, Protocol

from warren.storage.queuespec import QueueSpec

from ..broker.access import AccessControl
from ..broker.catalogue import Catalogue, VHost
from ..broker.exchange import Exchange
from ..config import Config
from ..errors import AMQPError
from ..snapshots import Totals
from ..values import QueueMeta
from .registry import Registry

# (access, kind, name) -> None; raises AMQPError 403 unless the user may.
Allow = Callable[[str, str, str], None]
# Makes a request record from its request number.
MakeRequest = Callable[[int], object]


class Peer(Protocol):
    """Something that answers requests: a shard, gateway 0, another gateway."""

    def request(self, make: MakeRequest, answered: Callable[[Any], None]) -> None: ...


class Shard(Peer, Protocol):
    """The link to one shard process."""

    index: int
    alive: bool  # False while its process (or, in a cluster, its node) is out of reach
    lazy_acks: int  # acks sent lazily and not yet flushed (consuming._room_left)

    def send(self, record: object, feeder: object = None, lazy: bool = False) -> None: ...


class Followers(Peer, Protocol):
    """Gateway 0's view of the other gateway processes; a request waits until all
    of them have the catalogue as it is now."""

    def caught_up(self) -> bool: ...

    def at(self, index: int) -> Peer: ...


CONFLICT = "conflict"  # a ClusterCatalogue request's answer: another node's change won


class ClusterCatalogue(Peer, Protocol):
    """In a cluster, where the catalogue is kept (etcd, through cluster/node.py): a
    request waits until this node's changes so far are there, and its answer is
    None, CONFLICT (another node's change won: run the command again) or the
    AMQPError to answer with."""

    def caught_up(self) -> bool: ...

    def refusal(self, doing: str) -> AMQPError | None:
        """Why the catalogue cannot change now, else None."""


class Broker(Protocol):
    """The broker as the session sees it."""

    index: int  # this gateway process
    authority: bool  # gateway 0: it alone changes the catalogue
    epoch: int  # counts the catalogue's changes: a remembered route holds while it stays
    config: Config
    totals: Totals
    access: AccessControl
    leader: Peer | None  # another gateway's link to gateway 0 (Forward)
    followers: Followers | None  # gateway 0 with others
    cluster: ClusterCatalogue | None  # gateway 0 of a node in a cluster
    down_shards: set[int]  # shards of other nodes out of reach: no route to their queues
    node_number: int  # this node's in a cluster (0: a node alone)

    # ids and holders: a channel or consumer the shards' events come back to
    def new_id(self) -> int: ...

    def add_holder(self, holder: int, channel: object) -> None: ...

    def forget_holder(self, holder: int) -> None: ...

    def release_holders(self, holders: Collection[int]) -> None:
        """Forget them, and tell every shard to requeue what they kept."""

    def link(self, shard: int) -> Shard: ...

    # routing and publishing
    def route(self, vhost: VHost, exchange: Exchange, routing_key: str,
              headers: Callable[[], dict]) -> list[QueueMeta]: ...

    def publish(self, targets: list[QueueMeta], exchange: str, routing_key: str,
                properties: bytes, body: bytes, persistent: bool, expiration: int,
                priority: int, confirm_channel: int = 0, seq: int = 0, tracker: object = None,
                feeder: object = None) -> None: ...

    def publish_to(self, sends: tuple, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, persistent: bool, expiration: int, priority: int,
                   confirm_channel: int = 0, seq: int = 0, tracker: object = None,
                   feeder: object = None) -> None: ...

    # direct reply-to
    def add_reply_channel(self, key: str, channel: object) -> None: ...

    def drop_reply_channel(self, key: str) -> None: ...

    def reply_channel(self, address: str) -> Any: ...

    def reply_elsewhere(self, exchange: str, routing_key: str, properties: bytes,
                        body: bytes, origin: int = 0, ask: int = 0) -> bool: ...

    # the catalogue: declarations checked as RabbitMQ does (broker/rules.py)
    def declare_exchange(self, exchange: Exchange, allow: Allow) -> tuple[Exchange, bool]: ...

    def delete_exchange(self, exchange: Exchange) -> None: ...

    def declare_queue(self, queue: QueueSpec, owner: object, server_named: bool,
                      allow: Allow) -> tuple[QueueMeta, bool]: ...

    def forget_queue(self, meta: QueueMeta) -> None: ...

    def binding_ends(self, vhost: str, source: str,
                     destination: tuple[str, str]) -> tuple[Exchange, Any]: ...

    def bind(self, exchange: Exchange, destination: tuple[str, str], routing_key: str,
             arguments: dict) -> None: ...

    def unbind(self, exchange: Exchange, destination: tuple[str, str], routing_key: str,
               arguments: dict) -> None: ...


class Client(Protocol):
    """The connection a channel belongs to, as the channel uses it."""

    id: int
    user: str
    vhost: VHost  # set before its channels open
    capabilities: dict
    frame_max: int
    routes: dict  # publishing.Route memory, shared by the connection's channels
    owed_confirms: set  # channels with confirms to send at the flush
    owed_grants: set  # consumers with window credit to return at the flush
    exclusive_queues: set

    @property
    def gateway(self) -> Broker: ...  # read only: a connection's is a Hub, more than this

    def send(self, data: bytes) -> None: ...

    def send_uncopied(self, parts: list) -> None: ...

    def schedule_flush(self) -> None: ...

    def run_guarded(self, channel: Any, action: Callable[[], None]) -> None: ...

    def hold(self, cause: object) -> None: ...

    def release(self, cause: object) -> None: ...

    def forget_channel(self, channel: Any) -> None: ...

    def close_channel_with_error(self, channel: Any, error: AMQPError) -> None: ...


class ShardLinks(Protocol):
    """The gateway's links to its shards (io/shardpool.ShardPool)."""

    links: list  # a Shard each, with `alive`

    def __iter__(self) -> Iterator[Any]: ...

    def send(self) -> None:
        """Write what the turn's work batched for each shard."""


class Alarms(Protocol):
    active: set  # the resource alarms on; empty when none

    def reason(self) -> str: ...


class Admission(Peer, Protocol):
    """Another gateway's link to gateway 0, which counts its connections and
    channels against the limits (node/worker.Leader)."""

    def admit(self, conn: Any, vhost: str, channels: int,
              answered: Callable[[str], None]) -> None: ...

    def channels_changed(self, conn: Any) -> None: ...


class Hub(Broker, Protocol):
    """The gateway process as a connection (session/connection.py) uses it."""

    catalogue: Catalogue
    registry: Registry
    shards: ShardLinks
    alarms: Alarms
    leader: Admission | None
    turns_by_kind: list[int]  # input turns so far: [publishes only, other commands]

    def take_shard_events(self) -> None: ...

    def take_answers(self) -> None: ...

    def flush_soon(self, conn: Any) -> None:
        """Have conn.flush() called at the end of this turn."""

    def limit_refusal(self, user: str, vhost: str, channel: bool = False) -> str | None: ...

    def delete_exclusive_queues(self, owner: Any) -> None: ...
