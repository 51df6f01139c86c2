"""The gateway's end of one shard: its process, its two rings, batching, credit.

The link also makes the rings of the other gateway processes (issue 19): one
pair per gateway, their command rings sharing one doorbell so the shard sleeps
on one fd; this gateway (0) uses pair 0 and hands pair k to gateway k.

Records for the shard collect during a loop turn and go out as one msgpack
array, one ring write and one doorbell. Events from the shard arrive on the
event ring's doorbell (or when a connection polls before reading more input)
and are handed to the broker in batches.

Credit flow (RabbitMQ's credit_flow, across processes): every publishing
connection holds PUBLISH_CREDIT messages of credit towards this shard. Each
publish record it sends spends one; the shard reports after each of its turns
how many ring records it has worked through (`Progress`, sent behind that
turn's deliveries), and the publishes in those records are credited back. A
connection out of credit is not read (state `flow`) until credit returns, so a
shard that is behind holds its publishers back instead of queueing without
bound in the ring or here. A full ring (large bodies) holds the same way.
A publish into a queue whose consumers are behind spends more (`PublishCost`,
which the shard sends as the queue's backlog grows and shrinks), so its
publishers slow towards the pace of its consumers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections import deque
from typing import Callable

import msgspec

from warren.shards.codec import decode_events, encode_batch
from warren.shards.logsetup import LogSettings

# Records by name: a compiled module would look each up in `records` at every use.
from warren.shards.records import (
    PUBLISH_CREDIT,
    GetReply,
    Progress,
    PublishCost,
    QueueInfoReply,
    Refusal,
    Reply,
    RingPair,
    Settle,
    ShardSpec,
    Stop,
    credit_cost,
)
from warren.shards.ring import Ring

from .children import spawn
from .exitwatch import ExitWatch

log = logging.getLogger("warren.shard")

# A flood cycles through every page of a ring, which then stays resident in both
# processes; 8 MiB rings were as fast as 16 MiB ones (4 MiB slowed 64 KiB bodies).
COMMAND_RING_BYTES = 8 * 1024 * 1024
EVENT_RING_BYTES = 8 * 1024 * 1024
# How long acks that may wait (send(..., lazy=True)) wait for other records to
# this shard before going alone: at a steady rate they ride with the next publish
# instead of waking the shard for themselves.
SETTLE_DELAY = 0.005


class ShardLink:
    def __init__(self, index: int, data_dir: str, stores: list[int], memory_limit: int,
                 stats_interval: float, store_map_size: int, on_events: Callable,
                 on_exit: Callable, log_dir: str = "", log: LogSettings = LogSettings(),
                 gateways: int = 1):
        self.index = index
        self.gateways = gateways
        self.log_dir = log_dir
        self.log = log
        self.data_dir = data_dir
        self.stores = stores
        self.memory_limit = memory_limit
        self.stats_interval = stats_interval
        self.store_map_size = store_map_size
        self._on_events = on_events  # (link, events) -> None
        self._on_exit = on_exit  # (link, returncode) -> None
        self._loop = asyncio.get_running_loop()
        self._batch: list = []
        self._pending: list = []  # encoded batches waiting for ring space
        # A flush is coming: a loop callback, or a caller's that set this (the end of a
        # connection's input, Gateway.take_shard_events): send() schedules none then.
        self.flush_scheduled = False
        self._lazy_until: asyncio.TimerHandle | None = None  # a batch of lazy acks only
        self.lazy_acks = 0  # deliveries those acks settle
        self._feeds: dict = {}  # connection -> publishes in the batch being gathered
        self.credit: dict = {}  # connection -> publish credit left towards this shard
        self.costs: dict = {}  # qid -> what a publish into it spends, where above 1
        self._unreturned: deque = deque()  # (record number, {connection: publishes})
        self._records_sent = 0  # ring records handed to this shard process
        self._dispatching = False
        self.paused: set = set()  # connections held: out of credit, or the ring is full
        self.process: subprocess.Popen | None = None
        self.alive = False
        self._next_req = 0
        self._waiters: dict[int, Callable] = {}

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # the shard's one
        self._pairs = [(Ring.create(COMMAND_RING_BYTES, self._doorbell),
                        Ring.create(EVENT_RING_BYTES)) for _ in range(self.gateways)]
        self.commands, self.events = self._pairs[0]
        lifeline_read, self._lifeline_write = os.pipe()
        spec = ShardSpec(self.index, self.data_dir,
                         [self.rings_for(k) for k in range(self.gateways)],
                         lifeline_read, self.stores, self.memory_limit, self.stats_interval,
                         self.store_map_size, self.log_dir, self.log)
        fds = [self._doorbell, lifeline_read]
        for commands, events in self._pairs:
            fds += [commands.spec().space_fd, events.spec().data_fd, events.spec().space_fd]
        self.process = spawn("warren.shards.main", msgspec.json.encode(spec), fds,
                             str(self.index))
        os.close(lifeline_read)
        self._exit_watch = ExitWatch(self._loop, self.process, self._process_exited)
        self._loop.add_reader(self.events.spec().data_fd, self._read_events)
        self.alive = True
        self._read_events()  # arms the doorbell (tells the shard we sleep)

    def attach(self, rings: RingPair, handed: bool = False) -> None:
        """Another gateway's link (not the root's): the rings the root made for this
        gateway, whose process is the root's to start and stop. `handed`: their
        doorbells came in a message (Handover), so they are this link's to close."""
        self.commands = Ring.attach(rings.commands, own_fds=handed)
        self.events = Ring.attach(rings.events, own_fds=handed)
        self._pairs = [(self.commands, self.events)]
        self._loop.add_reader(self.events.spec().data_fd, self._read_events)
        self.alive = True
        self._read_events()

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask the shard to finish its work and exit; kill it if it will not."""
        if not self.alive:
            return
        if self.process is None:  # attached: the root stops the shard
            return self._teardown()
        self.send(Stop())
        self.flush()
        deadline = self._loop.time() + timeout
        while self.process.poll() is None and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._teardown()

    def _process_exited(self) -> None:
        returncode = self.process.wait()
        self._teardown()
        self._on_exit(self, returncode)

    def detach(self) -> None:
        """An attached link's shard died (the root says): what waited fails."""
        self._teardown()

    def _teardown(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._loop.remove_reader(self.events.spec().data_fd)
        self._loop.remove_reader(self.commands.spec().space_fd)
        for pair in self._pairs:
            for ring in pair:
                ring.close()
                ring.unlink()
        if self.process is not None:
            self._exit_watch.cancel()
            os.close(self._lifeline_write)
            os.close(self._doorbell)
        self._batch.clear()
        self._stop_waiting()
        self._pending.clear()
        self._feeds.clear()
        self.credit.clear()  # a restarted shard starts a new count
        self.costs.clear()
        self._unreturned.clear()
        self._records_sent = 0
        waiters, self._waiters = self._waiters, {}
        for callback in waiters.values():
            callback(Reply(0, Refusal.SHARD_DOWN))
        self._resume_paused()

    def rings_for(self, gateway: int) -> RingPair:
        """The rings gateway `gateway` attaches to (with their doorbells' fds, which
        its process must inherit): fresh ones after each start of the shard."""
        commands, events = self._pairs[gateway]
        return RingPair(commands.spec(), events.spec())

    # -- commands out ----------------------------------------------------------

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
        """Queue a record for the shard, to go at the end of this loop turn. `lazy`
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
                last.seqs.extend(record.seqs)  # a run of acks: one record, as one multiple ack
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
        """Lazy acks in the batch wait no longer: they go with it."""
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
        if not self.alive:
            return
        if self._batch and self._lazy_until is None:
            self._pending.append(encode_batch(self._batch))
            self._batch = []
            self._records_sent += 1
            if self._feeds:
                self._spend(self._feeds)
                self._feeds = {}
        if self._pending or self.commands.backlogged():
            written = self.commands.write_many(self._pending)
            self.commands.flush()
            del self._pending[:written]
        if self._pending or self.commands.backlogged():
            self._ring_full()

    def _spend(self, feeds: dict) -> None:
        """The publishes of the record just numbered spend their connections' credit."""
        self._unreturned.append((self._records_sent, feeds))
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

    def _credit_returned(self, records: int) -> None:
        """The shard has worked through `records` ring records: credit their publishes back."""
        unreturned, credit = self._unreturned, self.credit
        while unreturned and unreturned[0][0] <= records:
            for conn, count in unreturned.popleft()[1].items():
                if conn in credit:
                    credit[conn] += count
        if self.paused:
            self._release_held()

    def _ring_full(self) -> None:
        for conn in self._feeds_in_flight():
            self._hold(conn)
        if self.commands.want_space():
            self._loop.add_reader(self.commands.spec().space_fd, self._space_available)
        else:
            self._loop.call_soon(self._space_available)

    def _feeds_in_flight(self) -> set:
        """Connections with publishes the shard has not worked through yet, in the
        ring or waiting for it: with the ring full, all who feed this shard wait."""
        return {conn for _, feeds in self._unreturned for conn in feeds}

    def _space_available(self) -> None:
        self._loop.remove_reader(self.commands.spec().space_fd)
        if not self.alive:
            return
        self.commands.clear_space_doorbell()
        self.flush()
        self._release_held()

    def _release_held(self) -> None:
        """Let held connections read again once the ring has room and they have credit."""
        if not self.paused or self._pending or self.commands.backlogged():
            return
        credit = self.credit
        for conn in [c for c in self.paused if credit.get(c, PUBLISH_CREDIT) > 0]:
            self.paused.discard(conn)
            conn.release(self)

    def _resume_paused(self) -> None:
        paused, self.paused = self.paused, set()
        for conn in paused:
            conn.release(self)

    # -- events in -------------------------------------------------------------

    def _read_events(self) -> None:
        """The event doorbell rang: take everything, then sleep on the doorbell.
        The doorbell is drained after the first take, not before: its drain is a
        system call, and the deliveries should not wait behind it."""
        if not self.alive:
            return
        self.poll()
        if self.alive:
            self.events.clear_data_doorbell()
        self.take_answers()

    def take_answers(self) -> None:
        """Take what the shard has sent, then sleep on the doorbell again: after
        the doorbell rang, or after a connection's input went out (while it was
        handled, Gateway.take_shard_events told the shard not to ring). Inside
        this link's own dispatch (a connection it resumed) the outer take does that."""
        if self._dispatching:
            return
        while self.alive and (self.poll() or not self.events.sleep()):
            pass

    def poll(self) -> bool:
        """Hand over the events waiting in the ring, if any; connections call this
        before reading more input, so deliveries and confirms go first."""
        if not self.alive or self._dispatching or self.events.is_empty():
            return False
        batches = self.events.read_many(decode_events)
        if not batches:  # only part of a large record so far
            return False
        events = batches[0] if len(batches) == 1 else [e for batch in batches for e in batch]
        self._dispatching = True  # events handed over in the shard's order, never nested
        try:
            self._dispatch(events)
        finally:
            self._dispatching = False
        return True

    def _dispatch(self, events: list) -> None:
        """Hand events over in the shard's order: a reply (say cancel-ok) must not
        overtake the deliveries the shard emitted before it."""
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
                    try:  # callbacks contain their own connection's errors; this is the last net
                        callback(event)
                    except Exception:
                        log.exception("shard %d reply %d failed", self.index, event.req)
            else:
                plain.append(event)
        if plain:
            self._on_events(self, plain)
