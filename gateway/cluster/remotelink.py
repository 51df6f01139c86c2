"""A shard of another node, seen from a gateway process: RemoteLink, and the one
TCP connection to that node its shards' links share (PeerConnection).

A RemoteLink is to the session what a ShardLink is (io/shardlink.py): records
gathered during a loop turn leave as one batch, publishing connections spend
credit towards the shard and get it back through `Progress`, replies reach
their waiters by `req`, and the other events go to `on_events(link, events)`.
Only the transport differs: a batch is a COMMANDS frame on the peer
connection, and the node's relay (relay.py) answers with EVENTS frames, its
Progress counting this link's frames the shard has worked through. The credit
logic is ShardLink's, repeated here: ShardLink is compiled, its steps C calls on
typed state, and a shared helper would be a Python call on its every batch.

When the connection goes (or the relay says the shard died), the link goes down
as a ShardLink whose shard died: waiters are refused with SHARD_DOWN, held
connections released, and `on_lost(link)` lets the hub cancel the consumers.
The connection comes back with back-off; then `on_up(link)`, with fresh credit.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
from collections import deque
from typing import Callable

from warren.shards.codec import decode_events
from warren.shards.records import (
    PUBLISH_CREDIT,
    GetReply,
    Progress,
    PublishCost,
    QueueInfoReply,
    Refusal,
    Reply,
    Settle,
    credit_cost,
)

from ..io.shardlink import SETTLE_DELAY
from . import wire

log = logging.getLogger("warren.cluster")

RETRY_FIRST = 0.1  # seconds before the first reconnection, doubled per failure
RETRY_MAX = 30.0
# A node that vanishes without closing (power, network) leaves a connection that
# looks open until a write times out, some 15 minutes later: probes find it idle
# in ~25 s, and data unacknowledged for 30 s ends it.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 10, 5, 3
UNACKNOWLEDGED_MS = 30_000


def keep_alive(transport: asyncio.BaseTransport) -> None:
    """Have the kernel probe an idle connection, so a dead peer is noticed."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux's; elsewhere the system's defaults
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKNOWLEDGED_MS)


class Awake:
    """A remote link's events come on the socket, never on a doorbell to arm."""

    def awake(self) -> None:
        pass


class RemoteLink:
    """Shard `shard` of the node `peer` reaches; `index` is the hub's number for it."""

    process = None  # another node's shard: no process of this node's

    def __init__(self, peer: PeerConnection, shard: int, index: int, on_events: Callable,
                 on_lost: Callable, on_up: Callable):
        self.peer = peer
        self.shard = shard
        self.index = index
        self._on_events = on_events  # (link, events) -> None
        self._on_lost = on_lost  # (link) -> None
        self._on_up = on_up  # (link) -> None
        self._loop = asyncio.get_running_loop()
        self.events = Awake()
        self.alive = False
        self.flush_scheduled = False
        self._lazy_until: asyncio.TimerHandle | None = None
        self.lazy_acks = 0
        self._batch: list = []
        self._feeds: dict = {}  # connection -> publishes in the batch being gathered
        self.credit: dict = {}  # connection -> publish credit left towards this shard
        self.costs: dict = {}  # qid -> what a publish into it spends, where above 1
        self._unreturned: deque = deque()  # (frame number, {connection: publishes})
        self._frames_sent = 0
        self.paused: set = set()  # connections held: out of credit, or the socket full
        self._next_req = 0
        self._waiters: dict[int, Callable] = {}

    # -- up and down -------------------------------------------------------------

    def up(self) -> None:
        if not self.alive:
            self.alive = True
            self._on_up(self)

    def down(self) -> None:
        """The connection or the shard is gone: what waited fails, held connections
        read again (their publishes to it are refused), the hub is told."""
        if self.alive:
            self._teardown()
            self._on_lost(self)

    async def stop(self) -> None:
        """This process stops: what waited fails, and nobody is told."""
        self._teardown()

    def _teardown(self) -> None:
        self.alive = False
        self._batch.clear()
        self._stop_waiting()
        self._feeds.clear()
        self.credit.clear()  # the relay starts a new count with the next connection
        self.costs.clear()
        self._unreturned.clear()
        self._frames_sent = 0
        waiters, self._waiters = self._waiters, {}
        for callback in waiters.values():
            callback(Reply(0, Refusal.SHARD_DOWN))
        paused, self.paused = self.paused, set()
        for conn in paused:
            conn.release(self)

    # -- commands out (as ShardLink's) -------------------------------------------

    def next_req(self) -> int:
        self._next_req += 1
        return self._next_req

    def request(self, make: Callable[[int], object], callback: Callable) -> None:
        """Send the command `make(req)` and call `callback(reply)` when it is answered."""
        if not self.alive:
            callback(Reply(0, Refusal.SHARD_DOWN))
            return
        req = self.next_req()
        self._waiters[req] = callback
        self.send(make(req))

    def send(self, record, feeder=None, lazy: bool = False) -> None:
        """Queue a record for the shard, to go at the end of this loop turn; `lazy`
        (an ack the queue does not need soon): a batch of nothing else waits up to
        SETTLE_DELAY for another record."""
        if not self.alive:
            return
        if lazy and not self._batch:
            self._lazy_until = self._loop.call_later(SETTLE_DELAY, self._lazy_due)
        elif not lazy and self._lazy_until is not None:
            self._stop_waiting()
        if self._lazy_until is not None:
            self.lazy_acks += len(record.seqs)
        if type(record) is Settle and self._batch:
            last = self._batch[-1]
            if type(last) is Settle and (last.qid, last.holder, last.outcome) == \
                    (record.qid, record.holder, record.outcome):
                last.seqs.extend(record.seqs)  # a run of acks: one record
                return
        self._batch.append(record)
        if feeder is not None:  # a publish: it spends its connection's credit
            cost = credit_cost(record)
            if self.costs:
                cost *= max([self.costs.get(qid, 1) for qid in record.qids])
            self._feeds[feeder] = self._feeds.get(feeder, 0) + cost
        if not self.flush_scheduled and self._lazy_until is None:
            self.flush_scheduled = True
            self._loop.call_soon(self.flush)

    def _stop_waiting(self) -> None:
        if self._lazy_until is not None:
            self._lazy_until.cancel()
            self._lazy_until = None
            self.lazy_acks = 0

    def _lazy_due(self) -> None:
        self._stop_waiting()
        self.flush()

    def flush(self) -> None:
        """Send the records gathered so far (not lazy acks that may wait)."""
        self.flush_scheduled = False
        if not self.alive or not self._batch or self._lazy_until is not None:
            return
        frames = wire.batch_frames(wire.COMMANDS, self.shard, self._batch)
        self._batch = []
        self._frames_sent += len(frames)
        if self._feeds:
            self._spend(self._feeds)
            self._feeds = {}
        self.peer.write(frames)
        if not self.peer.writable:
            self.socket_full()

    def _spend(self, feeds: dict) -> None:
        self._unreturned.append((self._frames_sent, feeds))
        credit = self.credit
        for conn, count in feeds.items():
            left = credit[conn] = credit.get(conn, PUBLISH_CREDIT) - count
            if left <= 0:
                self._hold(conn)

    def _hold(self, conn) -> None:
        if conn not in self.paused:
            self.paused.add(conn)
            conn.hold(self)

    def forget(self, conn) -> None:
        """A connection closed: drop its credit (publishes in flight return to nobody)."""
        self.credit.pop(conn, None)
        self._feeds.pop(conn, None)
        self.paused.discard(conn)

    def socket_full(self) -> None:
        """The connection's send buffer is over its mark: everyone with publishes
        on the way waits, as for a full ring."""
        for _, feeds in self._unreturned:
            for conn in feeds:
                self._hold(conn)

    def release_held(self) -> None:
        """Let held connections read again once the socket takes more and they
        have credit."""
        if not self.paused or not self.peer.writable:
            return
        credit = self.credit
        for conn in [c for c in self.paused if credit.get(c, PUBLISH_CREDIT) > 0]:
            self.paused.discard(conn)
            conn.release(self)

    def _credit_returned(self, frames: int) -> None:
        unreturned, credit = self._unreturned, self.credit
        while unreturned and unreturned[0][0] <= frames:
            for conn, count in unreturned.popleft()[1].items():
                if conn in credit:
                    credit[conn] += count
        if self.paused:
            self.release_held()

    # -- events in ---------------------------------------------------------------

    def poll(self) -> bool:
        """Events are handed over as their frames arrive: none wait here."""
        return False

    def take_answers(self) -> None:
        pass

    def receive(self, payload: bytes) -> None:
        """An EVENTS frame for this shard."""
        if self.alive:
            self._dispatch(decode_events(payload))

    def _dispatch(self, events: list) -> None:
        """In the shard's order, as ShardLink._dispatch: a reply must not overtake
        the deliveries sent before it."""
        plain = []
        for event in events:
            kind = type(event)
            if kind is Progress:
                self._credit_returned(event.records)
            elif kind is PublishCost:
                if event.cost > 1:
                    self.costs[event.qid] = event.cost
                else:
                    self.costs.pop(event.qid, None)
            elif kind is Reply or kind is GetReply or kind is QueueInfoReply:
                if plain:
                    self._on_events(self, plain)
                    plain = []
                callback = self._waiters.pop(event.req, None)
                if callback is not None:
                    try:
                        callback(event)
                    except Exception:
                        log.exception("remote shard %d reply %d failed", self.index,
                                      event.req)
            else:
                plain.append(event)
        if plain:
            self._on_events(self, plain)


class PeerConnection:
    """This gateway process's connection to the node at host:port and its shards' links:
    opened, authenticated, and opened again with back-off whenever it drops,
    until stop(). `indices[s]` is the hub's index for the node's shard s."""

    def __init__(self, host: str, port: int, secret: bytes, identity: wire.Identity,
                 indices: list[int], on_events: Callable, on_lost: Callable,
                 on_up: Callable, ssl: _ssl.SSLContext | None = None,
                 server_hostname: str | None = None):
        self.host, self.port = host, port
        self._secret = secret
        self.identity = identity
        self._ssl = ssl
        self._server_hostname = server_hostname
        self.links = [RemoteLink(self, shard, index, on_events, on_lost, on_up)
                      for shard, index in enumerate(indices)]
        self.writable = True
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task | None = None
        self._attempt: _PeerProtocol | None = None
        self._stopping = False
        self._wake = asyncio.Event()  # retry_now() cuts the back-off short
        self._seen_waiters: list[tuple[int, Callable[[], None]]] = []  # ask_seen's
        self._logged = ""  # the last trouble logged: the same again is not

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_open())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._attempt is not None:
            self._attempt.close()
        for link in self.links:
            await link.stop()

    def write(self, frames: list) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            for pieces in frames:
                transport.writelines(pieces)

    async def _keep_open(self) -> None:
        delay = RETRY_FIRST
        loop = asyncio.get_running_loop()
        while not self._stopping:
            protocol = self._attempt = _PeerProtocol(self)
            try:
                await loop.create_connection(
                    lambda: protocol, self.host, self.port, ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl else None)
                await asyncio.wait_for(protocol.opened, wire.HANDSHAKE_TIMEOUT)
            except (OSError, asyncio.TimeoutError, wire.WireError) as error:
                protocol.close()
                self._trouble(f"cannot open the link to {self.host}:{self.port}: "
                              f"{str(error) or type(error).__name__}")
            else:
                if self._logged:
                    log.warning("link to %s:%d open again", self.host, self.port)
                self._logged = ""
                delay = RETRY_FIRST
                await protocol.closed
                if not self._stopping:
                    self._trouble(f"link to {self.host}:{self.port} lost: {protocol.why}")
            if not self._stopping:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                    delay = RETRY_FIRST  # its node registered again: try now
                except asyncio.TimeoutError:
                    delay = min(delay * 2, RETRY_MAX)
                self._wake.clear()

    def _trouble(self, text: str) -> None:
        if text != self._logged:
            log.warning("%s", text)
            self._logged = text

    # -- from the protocol -------------------------------------------------------

    def _opened(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writable = True
        for link in self.links:
            link.up()

    def retry_now(self) -> None:
        """Its node is up again (etcd says): open the connection without waiting
        out the back-off."""
        self._wake.set()

    def reconnect(self) -> None:
        """Its node is down, etcd says: the links go down now (a link cut off
        sends nothing to notice), the connection is dropped and opened again."""
        if self._transport is not None:
            self._transport.abort()  # the protocol's connection_lost follows
            self._lost()

    def _lost(self) -> None:
        self._transport = None
        waiters, self._seen_waiters = self._seen_waiters, []
        for _, then in waiters:  # a node out of reach is waited for no longer
            then()
        self.writable = True
        for link in self.links:
            link.down()

    def send_reply(self, payload: bytes) -> bool:
        """A direct reply for the node (an encoded peermessages.Reply); False while
        the connection is not open."""
        if self._transport is None:
            return False
        self._transport.write(wire.frame(wire.REPLY, 0, payload))
        return True

    def ask_seen(self, revision: int, then: Callable[[], None]) -> bool:
        """Ask the node to say when its catalogue has applied `revision`; False
        (and nothing asked) while the connection is not open."""
        if self._transport is None:
            return False
        self._seen_waiters.append((revision, then))
        self._transport.write(wire.revision_frame(wire.SEEN_ASK, revision))
        return True

    def _frame(self, got: wire.Frame) -> None:
        if got.kind == wire.SEEN:
            revision = wire.revision_of(got)
            ready = [then for at, then in self._seen_waiters if at <= revision]
            self._seen_waiters = [w for w in self._seen_waiters if w[0] > revision]
            for then in ready:
                then()
            return
        if got.shard >= len(self.links):
            raise wire.WireError(f"a frame for shard {got.shard} of {len(self.links)}")
        link = self.links[got.shard]
        if got.kind == wire.EVENTS:
            link.receive(got.payload)
        elif got.kind == wire.SHARD_DOWN:
            link.down()
            self.write([[wire.frame(wire.SHARD_DOWN, got.shard)]])  # heard: see relay.py
        elif got.kind == wire.SHARD_UP:
            link.up()
        else:
            raise wire.WireError(f"a frame of kind {got.kind} on an open link")

    def _writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            for link in self.links:
                link.release_held()


class _PeerProtocol(asyncio.Protocol):
    """One attempt at the connection: the handshake, then frames to the links."""

    def __init__(self, peer: PeerConnection):
        self.peer = peer
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.why = "closed by the peer"
        self._reader = wire.FrameReader()
        self._dialer = wire.Dialer(peer._secret, peer.identity)
        self._transport: asyncio.Transport | None = None
        self._open = False

    def connection_made(self, transport) -> None:
        self._transport = transport
        keep_alive(transport)

    def data_received(self, data: bytes) -> None:
        self._reader.receive_data(data)
        try:
            while self._transport is not None:
                got = self._reader.next_frame()
                if got is None:
                    return
                if self._open:
                    self.peer._frame(got)
                elif not self._dialer.greeted:
                    self._transport.write(self._dialer.login(got))
                else:
                    self._dialer.welcome(got)
                    self._open = True
                    self._reader.max_frame = wire.MAX_FRAME
                    self.opened.set_result(None)
                    self.peer._opened(self._transport)
        except Exception as error:  # a broken frame or batch: the link cannot go on
            self.why = str(error) if isinstance(error, wire.WireError) else \
                f"undecodable frame ({type(error).__name__})"
            if not self.opened.done():
                self.opened.set_exception(wire.WireError(self.why))
            self.close()

    def pause_writing(self) -> None:
        if self._open:
            self.peer._writable(False)

    def resume_writing(self) -> None:
        if self._open:
            self.peer._writable(True)

    def close(self) -> None:
        """At once, and nothing more is read (connection_lost follows)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()

    def connection_lost(self, exc) -> None:
        self._transport = None
        if exc is not None:
            self.why = str(exc) or type(exc).__name__
        if not self.opened.done():
            self.opened.set_exception(wire.WireError(self.why))
        if self._open:
            self._open = False
            self.peer._lost()
        if not self.closed.done():
            self.closed.set_result(None)
