"""A stream queue's consumers as a pure state machine: commands in, effects out.

A stream removes nothing: its records stay in its log (storage/segmentlog.py)
until retention drops whole segments, and each consumer reads it from its own
offset. What is left here is the consumers: where each one is, its credit (the
gateway's link credit and its prefetch), the offsets it holds unacked and since
when (the consumer timeout). The shell (shards/streams.py) owns the log and a
reader per consumer, and answers the effects: `Attach` with the offset the
consumer starts at, `Feed` with the offsets it delivered. A Deliver's `seq` is
its offset, so settles name offsets."""

from __future__ import annotations

import re
from typing import NamedTuple

from .records import (
    Cancel,
    Consume,
    ConsumerCancelled,
    ConsumerTimedOut,
    DeleteQueue,
    Grant,
    Refusal,
    ReleaseHolders,
    Reply,
    Settle,
)

# x-max-age: a positive count of years, months, days, hours, minutes or seconds
_MAX_AGE = re.compile(r"(\d+)([YMDhms])")
_AGE_UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000,
                "h": 3_600_000, "m": 60_000, "s": 1000}


def parse_max_age(value: str) -> int | None:
    """A stream's x-max-age ("7D", "12h", "30m", "10s") in ms; None if it is none.
    (RabbitMQ counts a month as 30 days and a year as 365.)"""
    found = _MAX_AGE.fullmatch(value)
    if found is None or not int(found.group(1)):
        return None
    return int(found.group(1)) * _AGE_UNIT_MS[found.group(2)]


class Attach(NamedTuple):
    """Open a reader for this consumer from its x-stream-offset."""
    holder: int
    start: str  # "first" | "last" | "next" | "offset" | "timestamp"
    at: int


class Feed(NamedTuple):
    """Deliver up to `wanted` durable records from this consumer's reader."""
    holder: int
    wanted: int


class Detach(NamedTuple):
    """This consumer is gone: close its reader."""
    holder: int


class Drop(NamedTuple):
    """The stream is deleted: close and remove its log."""
    qid: int


class StreamConsumer:
    __slots__ = ("holder", "exclusive", "prefetch", "credit", "timeout_ms", "attached",
                 "unacked", "timed_out")

    def __init__(self, cmd: Consume):
        self.holder = cmd.holder
        self.exclusive = cmd.exclusive
        self.prefetch = cmd.prefetch
        self.credit = cmd.credit
        self.timeout_ms = cmd.timeout_ms
        self.attached = False  # the shell has its reader
        self.unacked: dict[int, float] = {}  # offset -> delivered at, in offset order
        self.timed_out = False  # it gets nothing more until cancelled

    def room(self) -> int:
        if not self.attached or self.timed_out:
            return 0
        room = self.credit
        if self.prefetch:
            room = min(room, self.prefetch - len(self.unacked))
        return max(room, 0)


class StreamQueue:
    """One stream's consumers. `durable` is the last offset its log has synced:
    nothing past it is read."""

    def __init__(self, qid: int, durable: int = -1):
        self.qid = qid
        self.durable = durable
        self.consumers: dict[int, StreamConsumer] = {}
        self.deleted = False
        self.delivered = 0  # records handed out, for the statistics

    def apply(self, cmd, now: float) -> list:
        kind = type(cmd)
        effects: list = []
        if kind is Settle:
            self._settle(cmd, effects)
        elif kind is Grant:
            consumer = self.consumers.get(cmd.holder)
            if consumer is not None:
                consumer.credit = cmd.credit if cmd.reset else consumer.credit + cmd.credit
                self._feed(consumer, effects)
        elif kind is Consume:
            if any(c.exclusive for c in self.consumers.values()) or (
                    cmd.exclusive and self.consumers):
                effects.append(Reply(cmd.req, Refusal.EXCLUSIVE_USE))
                return effects
            self.consumers[cmd.holder] = StreamConsumer(cmd)
            # consume-ok ahead of the deliveries the attach feeds, as RabbitMQ sends them
            effects.append(Reply(cmd.req, consumer_count=len(self.consumers)))
            effects.append(Attach(cmd.holder, cmd.stream_from or "next", cmd.stream_at))
        elif kind is Cancel:
            if self.consumers.pop(cmd.holder, None) is not None:
                effects.append(Detach(cmd.holder))
            effects.append(Reply(cmd.req))
        elif kind is ReleaseHolders:
            for holder in cmd.holders:
                if self.consumers.pop(holder, None) is not None:
                    effects.append(Detach(holder))
        elif kind is DeleteQueue:
            if cmd.if_unused and self.consumers:
                effects.append(Reply(cmd.req, Refusal.IN_USE))
                return effects
            effects.append(Reply(cmd.req))
            self._destroy(effects)
        return effects

    def attached(self, holder: int) -> list:
        """The shell opened this consumer's reader: feed it what is durable."""
        effects: list = []
        consumer = self.consumers.get(holder)
        if consumer is not None:
            consumer.attached = True
            self._feed(consumer, effects)
        return effects

    def synced(self, durable: int) -> list:
        """The log is durable up to `durable`: feed every consumer with room."""
        effects: list = []
        if durable > self.durable:
            self.durable = durable
            for consumer in self.consumers.values():
                self._feed(consumer, effects)
        return effects

    def fed(self, holder: int, offsets: list[int], now: float) -> None:
        """The shell delivered these offsets (fewer than its Feed asked for once
        it has caught up with the durable end: the next `synced` feeds it on)."""
        consumer = self.consumers.get(holder)
        if consumer is None:
            return
        consumer.credit -= len(offsets)
        for offset in offsets:
            consumer.unacked[offset] = now
        self.delivered += len(offsets)

    def lost(self, holder: int) -> list:
        """This consumer's reader cannot go on (the log is damaged where it
        reads): it is cancelled."""
        if self.consumers.pop(holder, None) is None:
            return []
        return [Detach(holder), ConsumerCancelled(holder, self.qid)]

    def tick(self, now: float) -> list:
        """Consumers whose oldest unacked record is older than their timeout:
        ConsumerTimedOut (the gateway cancels them, or closes their channel)."""
        effects: list = []
        for consumer in self.consumers.values():
            if consumer.timeout_ms and consumer.unacked and not consumer.timed_out:
                oldest = next(iter(consumer.unacked.values()))
                if now - oldest >= consumer.timeout_ms / 1000:
                    consumer.timed_out = True
                    effects.append(ConsumerTimedOut(consumer.holder, self.qid,
                                                    list(consumer.unacked), consumer.timeout_ms))
        return effects

    def next_deadline(self) -> float | None:
        deadlines = [next(iter(c.unacked.values())) + c.timeout_ms / 1000
                     for c in self.consumers.values()
                     if c.timeout_ms and c.unacked and not c.timed_out]
        return min(deadlines, default=None)

    def _settle(self, cmd: Settle, effects: list) -> None:
        # Any outcome only frees credit: reads never remove.
        consumer = self.consumers.get(cmd.holder)
        if consumer is None:
            return
        for offset in cmd.seqs:
            consumer.unacked.pop(offset, None)
        self._feed(consumer, effects)

    def _feed(self, consumer: StreamConsumer, effects: list) -> None:
        room = consumer.room()
        if room:
            effects.append(Feed(consumer.holder, room))

    def _destroy(self, effects: list) -> None:
        for holder in self.consumers:
            effects.append(Detach(holder))
            effects.append(ConsumerCancelled(holder, self.qid))
        self.consumers.clear()
        self.deleted = True
        effects.append(Drop(self.qid))
