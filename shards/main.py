"""The shard process: a thin I/O shell around its queues' state machines.

One loop turn: read every command batch waiting in the command ring, apply
them to the queues, then carry out the effects in one go: storage writes, then
events (deliveries, replies, confirms) to the gateway in one ring write and one
doorbell. When the command ring is empty the shard sleeps on the ring's
doorbell; when the event ring is full it stops reading commands, which is the
backpressure the gateway feels. Started by the gateway as
`python -m shards.main SPEC_JSON`.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

import msgspec

from storage.shardstore import ShardStore

from . import records as r
from .persister import Persister
from .queue import Delivered, Destroyed, Persist, Queue, Remove
from .ring import Ring, RingSpec

EVENTS_PER_RECORD = 512


class ShardSpec(msgspec.Struct):
    index: int
    data_dir: str
    commands: RingSpec
    events: RingSpec
    lifeline_fd: int  # read end of a pipe the gateway holds open; EOF = gateway gone
    stores: list[int]  # store directories DATA/shard-K to open: its own, then adopted ones
    memory_limit: int = 0  # bytes of message bodies in RAM before publishers are blocked


class Shard:
    """Commands in, effects out; the queues hold all the logic."""

    def __init__(self, index: int, persister: Persister):
        self.index = index
        self.persister = persister
        self.queues: dict[int, Queue] = {q.qid: q for q in persister.recover()}
        self.holder_queues: dict[int, set[int]] = {}  # who holds what where, for channel close
        self.outbox: list = []
        self.confirm_channels: list[int] = []
        self.confirm_seqs: list[int] = []
        self.running = True
        self.alarms: set[str] = set()
        self.ram_bytes = sum(q.ram_bytes for q in self.queues.values())  # bodies in RAM

    def take_events(self) -> list:
        """This turn's events but confirms, with stored content read back."""
        events, self.outbox = self.outbox, []
        self.persister.fill(events)
        return events

    def commit(self) -> bool:
        return self.persister.commit(self._evict)

    def _evict(self, qid: int, msg) -> None:
        queue = self.queues.get(qid)
        if queue is not None:
            before = queue.ram_bytes
            queue.evict(msg)
            self.ram_bytes += queue.ram_bytes - before

    def _apply(self, queue: Queue, cmd, now: float) -> None:
        before = queue.ram_bytes
        self._effects(queue.apply(cmd, now))
        self.ram_bytes += queue.ram_bytes - before

    def check_resources(self, memory_limit: int, stored: bool) -> None:
        """Raise or clear this shard's alarms (publishers are blocked while any is on)."""
        if memory_limit:
            self._alarm("memory", self.ram_bytes > memory_limit)
        self._alarm("disk", not stored)

    def _alarm(self, resource: str, active: bool) -> None:
        if active != (resource in self.alarms):
            (self.alarms.add if active else self.alarms.discard)(resource)
            self.outbox.append(r.Alarm(resource, active))

    def take_confirms(self, stored: bool) -> list:
        """This turn's confirms, to send once its writes are durable (or nacks)."""
        if not self.confirm_seqs:
            return []
        kind = r.Confirmed if stored else r.Rejected
        confirms = [kind(self.confirm_channels, self.confirm_seqs)]
        self.confirm_channels, self.confirm_seqs = [], []
        return confirms

    def handle(self, cmd, now: float) -> None:
        kind = type(cmd)
        if kind is r.Publish:
            for qid in cmd.qids:
                queue = self.queues.get(qid)
                if queue is not None:
                    self._apply(queue, cmd, now)
            if cmd.confirm_channel:
                self.confirm_channels.append(cmd.confirm_channel)
                self.confirm_seqs.append(cmd.confirm_seq)
        elif kind is r.CreateQueue:
            if cmd.qid not in self.queues:
                queue = self.queues[cmd.qid] = Queue(cmd)
                if queue.stored:
                    self.persister.create_queue(queue)
            self.outbox.append(r.Reply(cmd.req))
        elif kind is r.ReleaseHolders:
            qids: set[int] = set()
            for holder in cmd.holders:
                qids |= self.holder_queues.pop(holder, set())
            for qid in qids:
                queue = self.queues.get(qid)
                if queue is not None:
                    self._apply(queue, cmd, now)
        elif kind is r.Stop:
            self.running = False
        else:
            queue = self.queues.get(cmd.qid)
            if queue is None:
                self._missing_queue(cmd)
                return
            if kind is r.Consume or kind is r.Get:
                self.holder_queues.setdefault(cmd.holder, set()).add(cmd.qid)
            self._apply(queue, cmd, now)

    def _missing_queue(self, cmd) -> None:
        # The queue went away (deleted, or auto-deleted) after the gateway sent this.
        req = getattr(cmd, "req", None)
        if req is None:
            return
        if type(cmd) is r.Get:
            self.outbox.append(r.GetReply(req, cmd.qid, code=404, text="NOT_FOUND"))
        else:
            self.outbox.append(r.Reply(req, 404, "NOT_FOUND"))

    def _effects(self, effects: list) -> None:
        persister = self.persister
        for effect in effects:
            kind = type(effect)
            if kind is Persist:
                persister.persist(effect.qid, effect.messages)
            elif kind is Remove:
                persister.remove(effect.qid, effect.seqs)
            elif kind is Delivered:
                persister.mark_delivered(effect.qid, effect.seq)
            elif kind is Destroyed:
                self.queues.pop(effect.qid, None)
                persister.delete_queue(effect.qid)
            else:
                self.outbox.append(effect)


def _event_records(events: list) -> list[bytes]:
    return [r.encode_batch(events[i:i + EVENTS_PER_RECORD])
            for i in range(0, len(events), EVENTS_PER_RECORD)]


def serve(spec: ShardSpec) -> None:
    commands = Ring.attach(spec.commands)
    events = Ring.attach(spec.events)
    stores = {k: ShardStore(os.path.join(spec.data_dir, f"shard-{k}")) for k in spec.stores}
    shard = Shard(spec.index, Persister(stores, spec.index))
    poller = select.poll()
    poller.register(spec.commands.data_fd, select.POLLIN)
    poller.register(spec.lifeline_fd, select.POLLIN)
    pending: list[bytes] = []  # encoded event records waiting for ring space

    while shard.running:
        if pending or events.backlogged():
            written = events.write_many(pending)
            events.flush()
            del pending[:written]
            if pending or events.backlogged():
                if events.want_space():
                    _wait(poller, events.spec().space_fd, spec.lifeline_fd)
                    events.clear_space_doorbell()
                continue
        batches = commands.read_many()
        if not batches:
            if commands.sleep():
                _wait(poller, None, spec.lifeline_fd)
                commands.clear_data_doorbell()
            continue
        now = time.monotonic()
        for batch in batches:
            for cmd in r.decode_commands(batch):
                shard.handle(cmd, now)
        # Deliveries and replies go out at once; confirms only after the fsync.
        _send(events, pending, shard.take_events())
        stored = shard.commit()
        shard.check_resources(spec.memory_limit, stored)
        _send(events, pending, shard.take_confirms(stored) + shard.take_events())

    while pending or events.backlogged():  # hand over the last events before exiting
        del pending[:events.write_many(pending)]
        events.flush()
        if (pending or events.backlogged()) and events.want_space():
            _wait(poller, events.spec().space_fd, spec.lifeline_fd)
            events.clear_space_doorbell()
    shard.persister.close()


def _send(events: Ring, pending: list[bytes], records: list) -> None:
    if records:
        pending.extend(_event_records(records))
        del pending[:events.write_many(pending)]
        events.flush()


def _wait(poller: select.poll, extra_fd: int | None, lifeline_fd: int) -> set[int]:
    """Block until a registered fd (or `extra_fd`) is readable; exit if the gateway died."""
    if extra_fd is not None:
        poller.register(extra_fd, select.POLLIN)
    try:
        fds = {fd for fd, _ in poller.poll()}
    finally:
        if extra_fd is not None:
            poller.unregister(extra_fd)
    if lifeline_fd in fds:
        sys.exit(0)
    return fds


def main() -> None:
    # Ctrl-C, systemd and `timeout` signal the whole process group; the gateway
    # decides when shards stop (after draining), and a dead gateway is seen on
    # the lifeline pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = msgspec.json.decode(sys.argv[1], type=ShardSpec)
    os.set_blocking(spec.lifeline_fd, False)
    serve(spec)


if __name__ == "__main__":
    main()
