"""The links of one gateway process to the shards of the other nodes.

Indexes past this node's shards stand for other nodes' shards (members.py).
Each gets a link in the hub's list as soon as the catalogue names it: a
RemoteLink over the PeerConnection to its node once that node has registered
(its address is known), an Unreached one until then, which answers every
request as a shard that is down.
"""

from __future__ import annotations

import logging
import ssl as _ssl
from typing import Callable

from warren.shards.records import Refusal, Reply

from ..broker.peermessages import ClusterView, encode
from .members import Members
from .remotelink import Awake, PeerConnection
from .wire import Identity

log = logging.getLogger("warren.cluster")


class Unreached:
    """A shard of a node this one has not reached yet: down."""

    process = None
    alive = False
    flush_scheduled = False
    lazy_acks = 0

    def __init__(self, index: int, node: str):
        self.index = index
        self.node = node
        self.events = Awake()
        self.credit: dict = {}
        self.paused: set = set()
        self.costs: dict = {}

    def request(self, make: Callable, callback: Callable) -> None:
        callback(Reply(0, Refusal.SHARD_DOWN))

    def send(self, record, feeder=None, lazy: bool = False) -> None:
        pass

    def flush(self) -> None:
        pass

    def poll(self) -> bool:
        return False

    def take_answers(self) -> None:
        pass

    def forget(self, conn) -> None:
        pass

    async def stop(self) -> None:
        pass


def view_of(members: Members, number: int, secret: bytes):
    """The root's view for the other gateway processes (peermessages.ClusterView)."""
    return ClusterView(members.me, number, secret,
                       [(n, info.link, info.shards, info.number)
                        for n, info in sorted(members.known.items())],
                       sorted(members.running), list(members.remote))


def take_view(gateway, peers: Peers | None, view: ClusterView) -> Peers:
    """Another gateway process: the root's view applied, its links made (the first
    view) or extended."""
    if peers is None:
        members = Members(view.node, gateway.shards.count)
        peers = Peers(members, gateway.shards.links, Identity(view.node, view.number,
                                                              gateway.index),
                      view.secret, gateway._on_events, gateway._shard_lost, gateway.remote_up,
                      gateway.down_shards.add, ssl=client_tls(gateway.config))
    for name in peers.members.adopt_view(view.nodes, view.running, view.remote):
        peers.lost(name)
    peers.adopt()
    gateway.node_number, gateway.peers = view.number, peers
    return peers


def client_tls(config) -> _ssl.SSLContext | None:
    """The link's client side uses TLS where the node has a certificate; the
    shared secret authenticates the node, a CA bundle (if given) its certificate."""
    if not config.tls_certfile:
        return None
    context = _ssl.create_default_context(cafile=config.tls_cafile or None)
    context.check_hostname = False
    if not config.tls_cafile:
        context.verify_mode = _ssl.CERT_NONE
    context.load_cert_chain(config.tls_certfile, config.tls_keyfile)
    return context


class Peers:
    """`links`: the hub's list of links (ShardPool.links), extended here;
    `on_events`, `on_lost`, `on_up` as for a RemoteLink."""

    def __init__(self, members: Members, links: list, identity: Identity, secret: bytes,
                 on_events: Callable, on_lost: Callable, on_up: Callable,
                 down: Callable[[int], None], ssl: _ssl.SSLContext | None = None):
        self.members = members
        self.links = links
        self.identity = identity
        self.secret = secret
        self._callbacks = (on_events, on_lost, on_up)
        self._down = down
        self._ssl = ssl
        self.connections: dict[str, PeerConnection] = {}

    def adopt(self) -> None:
        """Links for every index the members have given out, and a connection to
        each node that has registered and has none yet."""
        members = self.members
        for name, info in members.known.items():
            if name in self.connections:
                if name in members.running:
                    self.connections[name].retry_now()
                continue
            if name == members.me:
                continue
            indices = [members.shard_of(name, shard) for shard in range(info.shards)]
            self._extend()
            host, _, port = info.link.rpartition(":")
            peer = PeerConnection(host, int(port), self.secret, self.identity, indices,
                                  *self._callbacks, ssl=self._ssl,
                                  server_hostname=host if self._ssl else None)
            for link in peer.links:
                link.node = name  # (a down link's queues answer 404 naming it)
                self.links[link.index] = link
            self.connections[name] = peer
            peer.start()
        self._extend()

    def _extend(self) -> None:
        members = self.members
        while len(self.links) < members.local_shards + len(members.remote):
            index = len(self.links)
            self.links.append(Unreached(index, members.locate(index)[0]))
            self._down(index)

    def send_reply(self, number: int, reply) -> bool:
        """A direct reply to a reply-to address of node `number`: over its link."""
        name = self.members.name_of_number(number)
        peer = self.connections.get(name) if name is not None else None
        return peer is not None and peer.send_reply(encode(reply))

    def lost(self, name: str) -> None:
        """etcd says node `name` is down: its links go down now, not when TCP
        notices (a cut link sends nothing), and the connection tries again."""
        peer = self.connections.get(name)
        if peer is not None:
            peer.reconnect()

    async def stop(self) -> None:
        for peer in self.connections.values():
            await peer.stop()
