"""A queue on another node, reached over TCP: a real shard process serving a
relay on its ring pair 1 (gateway/cluster/relay.py), and RemoteLinks
(gateway/cluster/remotelink.py) over loopback on the same event loop, playing
node 3's gateway processes. Through them a queue is made, published to with
confirms, consumed and settled as through a ShardLink; credit comes back by
Progress; a wrong secret opens nothing; a sender's connection that drops has
its unacked messages back in the queue; a shard's death and return reach the
remote links."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time

import pytest

from warren.gateway.cluster import wire
from warren.gateway.cluster.relay import Relay
from warren.gateway.cluster.remotelink import PeerConnection
from warren.shards import records as r
from warren.storage.queuespec import QueueSpec

from ..support.broker import free_port
from ..support.shardprocess import ShardProcess

pytestmark = pytest.mark.run_once

SECRET = b"a secret the nodes share"
SLOT = 1  # the relay's ring pair: the shard's gateway 0 is the test itself
NODE = 3
TIMEOUT = 10.0
QID = 1


def made_by(gateway: int, n: int) -> int:
    """The n-th id gateway `gateway` of node NODE makes."""
    return n * r.MAX_GATEWAYS + gateway


class Connection:
    """A publishing connection's stand-in: what the link told it."""

    def __init__(self):
        self.told: list[str] = []

    def hold(self, link) -> None:
        self.told.append("hold")

    def release(self, link) -> None:
        self.told.append("release")


class Gateway:
    """One gateway process of node NODE: its peer connection and what came back."""

    def __init__(self, port: int, gateway: int, secret: bytes = SECRET,
                 tls: ssl.SSLContext | None = None):
        self.events: list = []
        self.lost = self.up = 0
        self.peer = PeerConnection("127.0.0.1", port, secret,
                                   wire.Identity("rabbit@a", NODE, gateway), [0],
                                   self._on_events, self._on_lost, self._on_up, tls)
        self.link = self.peer.links[0]
        self.peer.start()

    def _on_events(self, link, events: list) -> None:
        self.events += events

    def _on_lost(self, link) -> None:
        self.lost += 1

    def _on_up(self, link) -> None:
        self.up += 1

    def of(self, kind) -> list:
        return [e for e in self.events if type(e) is kind]

    async def ask(self, make):
        answered = asyncio.get_running_loop().create_future()
        self.link.request(make, answered.set_result)
        return await asyncio.wait_for(answered, TIMEOUT)


async def until(condition, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def relayed(shard: ShardProcess, tls: ssl.SSLContext | None = None):
    end = shard.ends[SLOT]
    relay = Relay(SECRET, SLOT, [r.RingPair(end.commands.spec(), end.events.spec())], tls)
    await relay.start("127.0.0.1", free_port())
    gateways: list[Gateway] = []

    def connect(gateway: int, secret: bytes = SECRET,
                tls: ssl.SSLContext | None = None) -> Gateway:
        gateways.append(Gateway(relay.port, gateway, secret, tls))
        return gateways[-1]

    try:
        yield relay, connect
    finally:
        for gateway in gateways:
            await gateway.peer.stop()
        await relay.stop()


@pytest.fixture
def shard(tmp_path):
    shard = ShardProcess(str(tmp_path), gateways=2)
    yield shard
    shard.stop()


def create_queue(req: int) -> r.CreateQueue:
    spec = QueueSpec("/", "remote", False, False, False, {})
    return r.CreateQueue(req, QID, spec, spec.arguments)


def test_a_remote_queue_is_made_published_to_consumed_and_settled(shard):
    async def scenario():
        async with relayed(shard) as (relay, connect):
            a = connect(1)
            await until(lambda: a.link.alive)
            for transport in (a.peer._transport, relay.senders[(NODE, 1)]._transport):
                sock = transport.get_extra_info("socket")  # a vanished node is noticed
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) > 0
            assert (await a.ask(create_queue)).refused == r.Refusal.NONE
            # 200 transient publishes in one turn, confirmed: 150 credit runs out
            publisher, channel = Connection(), made_by(1, 2)
            for seq in range(1, 201):
                a.link.send(r.Publish([QID], "", "remote", b"\x00\x00", b"m%d" % seq, False,
                                      channel, seq), publisher)
            await until(lambda: sum(len(e.seqs) for e in a.of(r.Confirmed)) == 200)
            assert {c for e in a.of(r.Confirmed) for c in e.channels} == {channel}
            assert sorted(s for e in a.of(r.Confirmed) for s in e.seqs) == list(range(1, 201))
            # Progress returned the credit: the publisher was held, then let go
            await until(lambda: publisher.told == ["hold", "release"])
            assert a.link.credit[publisher] == r.PUBLISH_CREDIT
            assert (await a.ask(lambda req: r.QueueStatus(req, QID))).message_count == 200

            consumer = made_by(1, 3)
            reply = await a.ask(lambda req: r.Consume(req, QID, consumer, channel, "c", False,
                                                      False, 0, 1000))
            assert reply.refused == r.Refusal.NONE
            await until(lambda: len(a.of(r.Deliver)) == 200)
            assert {d.holder for d in a.of(r.Deliver)} == {consumer}  # the id A made
            seqs = [d.seq for d in a.of(r.Deliver)]
            a.link.send(r.Settle(QID, consumer, seqs[:120], r.SETTLE_ACK))
            info = await a.ask(lambda req: r.QueueInfo(req, [QID]))
            assert info.queues[0][1:4] == [0, 80, 1]  # ready, unacked, consumers

            a.link.send(r.Settle(QID, consumer, seqs[120:], r.SETTLE_REQUEUE))
            await until(lambda: len(a.of(r.Deliver)) == 280)  # back to the consumer
            assert all(d.redelivered for d in a.of(r.Deliver)[200:])
            info = await a.ask(lambda req: r.QueueInfo(req, [QID]))
            assert info.queues[0][1:4] == [0, 80, 1]

    asyncio.run(scenario())


def test_a_dropped_senders_unacked_messages_return_to_the_queue(shard):
    async def scenario():
        async with relayed(shard) as (relay, connect):
            a = connect(1)
            await until(lambda: a.link.alive)
            await a.ask(create_queue)
            for seq in range(1, 11):
                a.link.send(r.Publish([QID], "", "remote", b"\x00\x00", b"m", False))
            consumer = made_by(1, 5)
            await a.ask(lambda req: r.Consume(req, QID, consumer, made_by(1, 4), "c", False,
                                              False, 0, 1000))
            await until(lambda: len(a.of(r.Deliver)) == 10)

            a.peer._transport.abort()  # the network drops the connection
            await until(lambda: a.lost == 1)
            assert not a.link.alive
            b = connect(2)  # another gateway process of the node consumes
            await until(lambda: b.link.alive)
            second = made_by(2, 1)
            await b.ask(lambda req: r.Consume(req, QID, second, made_by(2, 2), "c2", False,
                                              False, 0, 1000))
            await until(lambda: len(b.of(r.Deliver)) == 10)
            assert all(d.redelivered and d.holder == second for d in b.of(r.Deliver))

            await until(lambda: a.up == 2)  # A's link came back by itself, fresh
            assert a.link.alive and a.link.credit == {}
            status = await a.ask(lambda req: r.QueueStatus(req, QID))
            assert (status.message_count, status.consumer_count) == (0, 1)

    asyncio.run(scenario())


def test_a_wrong_secret_opens_nothing(shard, caplog):
    async def scenario():
        async with relayed(shard) as (relay, connect):
            intruder = connect(1, secret=b"a guess")
            await until(lambda: "wrong MAC" in caplog.text)
            assert not intruder.link.alive and intruder.up == 0
            assert relay.senders == {}
            assert (await intruder.ask(r.Sync)).refused == r.Refusal.SHARD_DOWN
            # garbage instead of a login: the relay closes the connection at once
            loop = asyncio.get_running_loop()
            with socket.create_connection(("127.0.0.1", relay.port)) as raw:
                raw.setblocking(False)
                await loop.sock_sendall(raw, b"GET / HTTP/1.1\r\n\r\n")
                got = b""
                while chunk := await asyncio.wait_for(loop.sock_recv(raw, 4096), TIMEOUT):
                    got += chunk
                # the hello, then the end: nothing of the garbage was taken
                assert (len(got), got[4]) == (wire.HEADER_SIZE + 1 + wire.NONCE_SIZE, wire.HELLO)
            await until(lambda: "unknown frame kind" in caplog.text)
        assert SECRET.decode() not in caplog.text

    with caplog.at_level(logging.WARNING, logger="warren.cluster"):
        asyncio.run(scenario())


def test_a_shards_death_and_return_reach_the_remote_links(shard):
    async def scenario():
        async with relayed(shard) as (relay, connect):
            a = connect(1)
            await until(lambda: a.link.alive)
            await a.ask(create_queue)
            end = shard.ends[SLOT]
            relay.shard_lost(0)
            assert relay.senders[(NODE, 1)].told_down == {0}
            await until(lambda: a.lost == 1)
            assert (await a.ask(r.Sync)).refused == r.Refusal.SHARD_DOWN
            b = connect(2)  # a gateway that connects meanwhile hears it is down
            await until(lambda: b.up == 1 and b.lost == 1)
            # each acknowledged it: what they send from now on, they send knowing it
            await until(lambda: all(not sender.told_down for sender in relay.senders.values()))
            relay.shard_restarted(0, r.RingPair(end.commands.spec(), end.events.spec()))
            await until(lambda: a.up == 2 and b.up == 2)
            assert (await a.ask(lambda req: r.QueueStatus(req, QID))).refused == r.Refusal.NONE
            publisher = Connection()  # the counts of frames start afresh on both sides
            for _ in range(200):
                a.link.send(r.Publish([QID], "", "remote", b"\x00\x00", b"m", False), publisher)
            await until(lambda: publisher.told == ["hold", "release"])
            assert a.link.credit[publisher] == r.PUBLISH_CREDIT

    asyncio.run(scenario())


def test_the_link_runs_over_tls(shard, certificate):
    cert, key = certificate
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))

    async def scenario():
        async with relayed(shard, server) as (relay, connect):
            a = connect(1, tls=client)
            await until(lambda: a.link.alive)
            assert (await a.ask(create_queue)).refused == r.Refusal.NONE
            a.link.send(r.Publish([QID], "", "remote", b"\x00\x00", b"x" * 100_000, False))
            consumer = made_by(1, 1)
            await a.ask(lambda req: r.Consume(req, QID, consumer, made_by(1, 2), "c", True,
                                              False, 0, 10))
            await until(lambda: len(a.of(r.Deliver)) == 1)
            assert a.of(r.Deliver)[0].body == b"x" * 100_000  # a body beside its batch

    asyncio.run(scenario())


def test_publishers_wait_while_the_connection_takes_no_more(shard):
    async def scenario():
        async with relayed(shard) as (relay, connect):
            a = connect(1)
            await until(lambda: a.link.alive)
            await a.ask(create_queue)
            relay.senders[(NODE, 1)]._transport.pause_reading()  # node B stops reading
            publisher = Connection()
            body = b"b" * (1 << 20)
            for _ in range(64):  # 64 MiB: more than the sockets hold, 64 of 150 credit
                a.link.send(r.Publish([QID], "", "remote", b"\x00\x00", body, False), publisher)
                a.link.flush()
            await until(lambda: publisher.told == ["hold"])
            relay.senders[(NODE, 1)]._transport.resume_reading()
            await until(lambda: publisher.told == ["hold", "release"])
            status = await a.ask(lambda req: r.QueueStatus(req, QID))
            assert status.message_count == 64

    asyncio.run(scenario())
