"""The shards of this node, for the gateway processes of the others: the relay.

It runs in the root and is, to each of this node's shards, one more gateway
process: slot G, a ShardLink attached to the shard's ring pair G as a worker
gateway attaches to its own. Its server accepts the other nodes' peer
connections (remotelink.py), one per remote gateway process (a "sender"), and
after the handshake (wire.py) forwards each COMMANDS frame's records through
the shard's link, its ids renamed so that the shard's events for them come to
slot G (idmap.py), and sends those events back, renamed again, to the sender
they concern.

Requests go out with the relay's own req and their replies back with the
sender's. Behind each forwarded frame goes a Sync; its answer means the shard
has worked through the frame, and the sender gets `Progress(n)`, its n frames
for that shard worked through so far, which returns its publishers' credit. So
the relay holds no more than the senders' credit lets them send. When a
sender's connection drops, what its consumers and basic.gets held goes back to
the queues (ReleaseHolders), as when a channel closes. When a shard dies or
runs again, the root calls shard_lost / shard_restarted, and every sender hears
it (SHARD_DOWN / SHARD_UP); until a sender acknowledges the SHARD_DOWN, its
COMMANDS for that shard were sent before it knew, and are dropped, so they
cannot reach the restarted shard and skew the count of its Progress.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from functools import partial

import msgspec

from warren.shards.codec import decode_commands
from warren.shards.records import (
    Alarm,
    Cancel,
    Consume,
    CreateQueue,
    DeleteQueue,
    GatewayLost,
    Get,
    InSyncWritten,
    Progress,
    PublishCost,
    PurgeQueue,
    QueueInfo,
    QueueStatus,
    ReleaseHolders,
    ReplicaRole,
    RingPair,
    Stop,
    Sync,
)

from ..broker.peermessages import decode_message
from ..io.shardpool import ShardLink
from . import idmap, wire
from .remotelink import keep_alive

log = logging.getLogger("warren.cluster")

_REQUESTS = frozenset((CreateQueue, QueueStatus, DeleteQueue, PurgeQueue, Consume, Cancel, Get,
                       QueueInfo, Sync))
# the root's own to send, never a peer's
_SUPERVISORS = frozenset((Stop, GatewayLost, ReplicaRole, InSyncWritten))


class Relay:
    """Slot `slot` of this node's shards, whose ring pairs for it are `rings`
    (None for a shard that is down)."""

    def __init__(self, secret: bytes, slot: int, rings: list[RingPair | None],
                 ssl: _ssl.SSLContext | None = None):
        self._secret = secret
        self.slot = slot
        self._ssl = ssl
        self.links: list = [self._attached(index, pair) for index, pair in enumerate(rings)]
        self.senders: dict[tuple[int, int], _Sender] = {}  # (node, gateway) -> its connection
        self._alarms: dict[tuple[int, str], bool] = {}  # (shard, resource) -> on
        self._costs: list[dict] = [{} for _ in rings]  # per shard: the costs senders know
        self._server: asyncio.Server | None = None
        self._stopping = False
        # when_seen(revision, then): `then()` once the catalogue is at `revision`
        # (the node's; a relay alone, as in its tests, is at every revision)
        self.when_seen = lambda revision, then: then()
        # on_reply(reply): a direct reply to one of this node's reply-to addresses
        self.on_reply = lambda reply: None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Sender(self), host, port,
                                                ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for sender in list(self.senders.values()):
            sender.close()
        if self._server is not None:
            await self._server.wait_closed()
        for link in self.links:
            await link.stop()

    def _attached(self, index: int, rings: RingPair | None) -> ShardLink:
        link = ShardLink(index, "", [], 0, 0, 0, self._on_events, _no_exit)
        if rings is not None:
            link.attach(rings)
        return link

    # -- this node's shards --------------------------------------------------------

    def shard_lost(self, index: int) -> None:
        """Shard `index` died: what waited fails, and the senders are told."""
        link = self.links[index]
        if not link.alive:
            return
        link.detach()
        self._costs[index] = {}
        for key in [key for key in self._alarms if key[0] == index]:
            del self._alarms[key]
        for sender in self.senders.values():
            sender.control(wire.SHARD_DOWN, index)

    def shard_restarted(self, index: int, rings: RingPair) -> None:
        """Shard `index` runs again, on these rings: the senders start counting
        their frames for it afresh."""
        self.shard_lost(index)
        self.links[index] = self._attached(index, rings)
        for sender in self.senders.values():
            sender.batches[index] = 0
            sender.control(wire.SHARD_UP, index)

    # -- senders ---------------------------------------------------------------------

    def joined(self, sender: _Sender) -> None:
        """A sender proved itself: it replaces an earlier connection of the same
        gateway process, and hears what it missed: shards down, alarms on, costs."""
        key = sender.key
        earlier = self.senders.get(key)
        if earlier is not None:  # its holders go back before the new one's commands
            earlier.close()
            earlier.open = False
            self.left(earlier)
        self.senders[key] = sender
        for index, link in enumerate(self.links):
            if not link.alive:
                sender.control(wire.SHARD_DOWN, index)
        for (index, resource), active in self._alarms.items():
            if active:
                sender.queue(index, [Alarm(resource, True)])
        for index, costs in enumerate(self._costs):
            if costs:
                sender.queue(index, [PublishCost(qid, cost) for qid, cost in costs.items()])

    def left(self, sender: _Sender) -> None:
        """A sender's connection is gone: what its consumers and basic.gets held
        returns to the queues."""
        if self.senders.get(sender.key) is sender:
            del self.senders[sender.key]
        holders, sender.holders = sender.holders, set()
        if holders and not self._stopping:
            for link in self.links:
                link.send(ReleaseHolders(sorted(holders)))

    def commands(self, sender: _Sender, shard: int, payload: bytes) -> None:
        """A COMMANDS frame: its records to the shard, renamed, and a Sync behind them."""
        if shard >= len(self.links):
            raise wire.WireError(f"a frame for shard {shard} of {len(self.links)}")
        records = decode_commands(payload)
        link = self.links[shard]
        if not link.alive or shard in sender.told_down:
            return  # sent before the sender heard that the shard died: it failed there
        node, slot, holders = sender.key[0], self.slot, sender.holders
        for record in records:
            kind = type(record)
            if kind in _SUPERVISORS:
                raise wire.WireError(f"a {kind.__name__} record from node {node}")
            holder = idmap.map_command(record, node, slot)
            if holder:
                holders.add(holder)
            elif kind is ReleaseHolders:
                holders.difference_update(record.holders)
            if kind in _REQUESTS and record.req:
                link.request(partial(_renumbered, record),
                             partial(self._answer, sender, shard, record.req))
            else:
                link.send(record)
        count = sender.batches[shard] = sender.batches.get(shard, 0) + 1
        link.request(Sync, partial(self._worked_through, sender, shard, count))

    def seen(self, sender: _Sender, revision: int) -> None:
        """Tell the sender once this node's catalogue has applied `revision`."""
        def answer() -> None:
            if sender.open and sender._transport is not None:
                sender.flush()
                sender._transport.write(wire.revision_frame(wire.SEEN, revision))
        self.when_seen(revision, answer)

    def _answer(self, sender: _Sender, shard: int, req: int, reply) -> None:
        if sender.open:
            sender.queue(shard, [msgspec.structs.replace(reply, req=req)])

    def _worked_through(self, sender: _Sender, shard: int, count: int, reply) -> None:
        if sender.open and not reply.refused:
            sender.queue(shard, [Progress(count)])
        self._publish_costs(shard)

    def _on_events(self, link: ShardLink, events: list) -> None:
        """A shard's events for slot G, each to the sender it concerns."""
        for event in events:
            if type(event) is Alarm:
                self._alarms[(link.index, event.resource)] = event.active
        senders = self.senders
        for key, routed in idmap.route_events(events, senders).items():
            senders[key].queue(link.index, routed)
        self._publish_costs(link.index)

    def _publish_costs(self, shard: int) -> None:
        """What a publish into a queue spends: the link keeps it (ShardLink takes
        PublishCost in), the senders hear when it changed."""
        costs, told = self.links[shard].costs, self._costs[shard]
        if costs == told:
            return
        changes = [PublishCost(qid, cost) for qid, cost in costs.items() if told.get(qid) != cost]
        changes += [PublishCost(qid, 1) for qid in told if qid not in costs]
        self._costs[shard] = dict(costs)
        for sender in self.senders.values():
            sender.queue(shard, list(changes))


def _renumbered(record, req: int):
    record.req = req
    return record


def _no_exit(link: ShardLink, returncode: int) -> None:
    """An attached link has no process of its own to watch exit."""


class _Sender(asyncio.Protocol):
    """One peer connection: the handshake, then its frames to the relay and its
    events out, one EVENTS frame per shard a loop turn."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.key = (0, 0)  # (node, gateway), once the handshake is done
        self.open = False
        self.holders: set[int] = set()  # mapped ids of its consumers and basic.get channels
        self.batches: dict[int, int] = {}  # shard -> its frames forwarded since it was up
        # Shards it was told are down and has not acknowledged yet: its COMMANDS for
        # them were sent before it knew, and would count in the next start's Progress.
        self.told_down: set[int] = set()
        self._out: dict[int, list] = {}  # shard -> events to send this turn
        self._flush_scheduled = False
        self._reader = wire.FrameReader()
        self._acceptor = wire.Acceptor(relay._secret)
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport
        keep_alive(transport)
        address = transport.get_extra_info("peername")
        self._peer = f"{address[0]}:{address[1]}" if address else "?"
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(wire.HANDSHAKE_TIMEOUT, self._refuse,
                                            "no login in time")
        transport.write(self._acceptor.hello())

    def data_received(self, data: bytes) -> None:
        self._reader.receive_data(data)
        try:
            while self._transport is not None:
                got = self._reader.next_frame()
                if got is None:
                    return
                if self.open:
                    if got.kind == wire.COMMANDS:
                        self.relay.commands(self, got.shard, got.payload)
                    elif got.kind == wire.SHARD_DOWN:
                        self.told_down.discard(got.shard)
                    elif got.kind == wire.SEEN_ASK:
                        self.relay.seen(self, wire.revision_of(got))
                    elif got.kind == wire.REPLY:
                        self.relay.on_reply(decode_message(got.payload))
                    else:
                        raise wire.WireError(f"a frame of kind {got.kind} from a gateway")
                else:
                    self._login(got)
        except Exception as error:  # a broken frame or batch: the link cannot go on
            self._refuse(str(error) if isinstance(error, wire.WireError)
                         else f"undecodable frame ({type(error).__name__})")

    def _login(self, got: wire.Frame) -> None:
        identity, welcome = self._acceptor.login(got)
        if self._timer is not None:
            self._timer.cancel()
        self._reader.max_frame = wire.MAX_FRAME
        self.key = (identity.node, identity.gateway)
        self.open = True
        self._transport.write(welcome)
        log.info("link from node %s (%d) gateway %d at %s open", identity.name, identity.node,
                 identity.gateway, self._peer)
        self.relay.joined(self)

    def _refuse(self, why: str) -> None:
        log.warning("link from %s closed: %s", self._peer, why)
        self.close()

    def close(self) -> None:
        """At once, and nothing more is read or written (connection_lost follows)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()

    def connection_lost(self, exc) -> None:
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
        if self.open:
            self.open = False
            self._out.clear()
            self.relay.left(self)

    # -- out ---------------------------------------------------------------------

    def queue(self, shard: int, events: list) -> None:
        out = self._out.get(shard)
        if out is None:
            self._out[shard] = events
        else:
            out += events
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def control(self, kind: int, shard: int) -> None:
        """SHARD_DOWN / SHARD_UP, behind the events already queued."""
        self.flush()
        if kind == wire.SHARD_DOWN:
            self.told_down.add(shard)
        if self._transport is not None:
            self._transport.write(wire.frame(kind, shard))

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, {}
        if self._transport is None:
            return
        for shard, events in out.items():
            for pieces in wire.batch_frames(wire.EVENTS, shard, events):
                self._transport.writelines(pieces)
