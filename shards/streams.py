"""A shard's stream queues: the I/O shell around each stream's pure core
(shards/stream.py). Each stream is a segment log (storage/segmentlog.py) under
its store's directory (`shard-K/streams/<qid>/`) and a reader per consumer;
publishes append to the log, the shard's group commit syncs it (Persister:
`sync_points`, then `synced`), and consumers are fed from the files up to the
durable offset, never from memory.

A record's payload is one msgpack array [exchange, routing key, properties,
body], its properties already carrying the x-stream-offset header: the offset is
known at the append, and a record is read far more often than written."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

import msgspec

from warren.gateway.amqp.properties import PropertiesError, decode_properties, encode_properties
from warren.storage.segmentlog import SegmentLog, SegmentLogDamaged, SyncPoint

from .records import ConfigureQueue, CreateQueue, Deliver, QueueStatus, Reply
from .stream import Attach, Detach, Drop, Feed, StreamQueue, parse_max_age

log = logging.getLogger("warren.shard")

TIMER = "streams"  # the shard's timer key for the streams' timed work
RETAIN_EVERY = 1.0  # seconds between retention checks of a stream
SEGMENT_BYTES = 500_000_000  # RabbitMQ's default x-stream-max-segment-size-bytes
FEED_RECORDS = 256  # records read for a consumer at a time
FEED_BYTES = 1 << 20

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(tuple).decode


class Stream:
    """One stream: its log, its core, its consumers' readers and its retention."""

    __slots__ = ("qid", "spec", "log", "core", "readers", "max_bytes", "max_age_ms",
                 "retain_at", "appended", "appended_bytes", "read")

    def __init__(self, qid: int, spec, arguments: dict, path: str):
        self.qid = qid
        self.spec = spec
        self.log = SegmentLog.open(path, _positive(arguments.get(
            "x-stream-max-segment-size-bytes")) or SEGMENT_BYTES)
        self.core = StreamQueue(qid, self.log.durable_offset)
        self.readers: dict = {}
        self.configure(arguments)
        self.retain_at = 0.0  # (monotonic) when its age is checked next
        self.appended = 0  # records and their bodies' bytes, for the statistics
        self.appended_bytes = 0
        self.read = 0

    def configure(self, arguments: dict) -> None:
        age = arguments.get("x-max-age")
        self.max_age_ms = parse_max_age(age) if isinstance(age, str) else None
        self.max_bytes = _positive(arguments.get("x-max-length-bytes"))
        size = _positive(arguments.get("x-stream-max-segment-size-bytes"))
        self.log.max_segment_bytes = size or SEGMENT_BYTES

    def retain(self, now: float) -> None:
        """Drop old segments: by size after every sync, by age every RETAIN_EVERY."""
        age_due = self.max_age_ms is not None and now >= self.retain_at
        if self.max_bytes is None and not age_due:
            return
        if age_due:
            self.retain_at = now + RETAIN_EVERY
        self.log.apply_retention(self.max_bytes, self.max_age_ms if age_due else None)


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


class Streams:
    """The shard's streams by qid. The shard gives it its outbox and timers
    (`bind`); the persister, which finds the streams at recovery, syncs them."""

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        self.dirty: set[int] = set()  # appended to since the last sync point
        self.outbox: Any = None  # the shard's Outbox and TimerHeap, once bound
        self.timers: Any = None

    def bind(self, outbox, timers) -> None:
        self.outbox = outbox
        self.timers = timers
        self._schedule()

    def open(self, cmd: CreateQueue, path: str) -> None:
        self.streams[cmd.qid] = Stream(cmd.qid, cmd.spec, cmd.arguments, path)

    # -- commands ----------------------------------------------------------------

    def publish(self, qid: int, cmd) -> None:
        stream = self.streams[qid]
        offset = stream.log.next_offset
        stream.log.append(_encode((cmd.exchange, cmd.routing_key,
                                   _with_offset(cmd.properties, offset), cmd.body)),
                          int(time.time() * 1000))
        stream.appended += 1
        stream.appended_bytes += len(cmd.body)
        self.dirty.add(qid)

    def apply(self, qid: int, cmd, now: float) -> None:
        stream = self.streams[qid]
        kind = type(cmd)
        if kind is QueueStatus:
            self.outbox.add(Reply(cmd.req, message_count=_messages(stream),
                                  consumer_count=len(stream.core.consumers)))
            return
        if kind is ConfigureQueue:
            stream.configure(cmd.arguments)
            return
        self._effects(stream, stream.core.apply(cmd, now))
        self._schedule()

    def tick(self, now: float) -> None:
        for stream in list(self.streams.values()):
            stream.retain(now)
            self._effects(stream, stream.core.tick(now))
        self._schedule()

    def _schedule(self) -> None:
        if self.timers is None:
            return
        deadlines = [d for s in self.streams.values() if (d := s.core.next_deadline()) is not None]
        deadlines += [s.retain_at for s in self.streams.values() if s.max_age_ms is not None]
        self.timers.schedule(TIMER, min(deadlines, default=None))

    def _effects(self, stream: Stream, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is Feed:
                self._feed(stream, effect.holder, effect.wanted)
            elif kind is Attach:
                start = effect.start
                if start == "offset":
                    start = effect.at
                elif start == "timestamp":
                    start = ("timestamp", effect.at)
                stream.readers[effect.holder] = stream.log.reader(start)
                self._effects(stream, stream.core.attached(effect.holder))
            elif kind is Detach:
                stream.readers.pop(effect.holder, None)
            elif kind is Drop:
                self._drop(stream)
            else:
                self.outbox.add(effect)

    def _feed(self, stream: Stream, holder: int, wanted: int) -> None:
        """Deliver up to `wanted` records from the consumer's reader: fewer once it
        has read everything durable (the next sync feeds it on)."""
        reader = stream.readers.get(holder)
        outbox, qid = self.outbox, stream.qid
        while reader is not None and wanted > 0:
            try:
                records = reader.read(min(wanted, FEED_RECORDS), FEED_BYTES)
            except SegmentLogDamaged:
                # the rest of the stream and its other readers go on
                log.exception("stream %s: cancelling a consumer that cannot read on",
                              stream.spec.name)
                self._effects(stream, stream.core.lost(holder))
                return
            if not records:
                return
            for offset, _timestamp, payload in records:
                exchange, routing_key, properties, body = _decode(payload)
                outbox.add(Deliver(holder, qid, offset, False, exchange, routing_key,
                                   properties, body))
            stream.read += len(records)
            stream.core.fed(holder, [record[0] for record in records], time.monotonic())
            wanted -= len(records)

    def _drop(self, stream: Stream) -> None:
        del self.streams[stream.qid]
        self.dirty.discard(stream.qid)
        stream.readers.clear()
        stream.log.close()
        shutil.rmtree(stream.log.path, ignore_errors=True)

    # -- the group commit --------------------------------------------------------

    def sync_points(self) -> tuple[list[tuple[int, SyncPoint, int]], bool]:
        """Flush every stream appended to, on the shard's thread: (qid, what the
        committer thread then makes durable, records it covers), and False if a
        flush failed (a full disk): its records stay buffered for the next
        commit, and this one fails."""
        points, flushed = [], True
        for qid in self.dirty:
            stream = self.streams.get(qid)
            if stream is None:
                continue
            durable = stream.log.durable_offset
            try:
                point = stream.log.sync_point()
            except OSError:
                log.exception("flushing stream log %s", stream.log.path)
                flushed = False
                continue
            points.append((qid, point, point.offset - durable))
        self.dirty = {qid for qid in self.dirty if qid in self.streams} if not flushed else set()
        return points, flushed

    def synced(self, points: list[tuple[int, SyncPoint, int]], ok: bool) -> None:
        """After the commit that ran `points`: feed the consumers what became
        durable, and drop old segments."""
        now = time.monotonic()
        for qid, point, _records in points:
            stream = self.streams.get(qid)
            if stream is None:
                continue
            if not ok:
                self.dirty.add(qid)
                continue
            stream.log.synced(point)
            self._effects(stream, stream.core.synced(stream.log.durable_offset))
            stream.retain(now)
        self._schedule()

    # -- figures -------------------------------------------------------------------

    def figures(self, qid: int) -> list[int]:
        """QueueInfoReply's row (records.QUEUE_INFO_FIELDS): a stream's messages
        are what its log keeps, all ready (reading removes none), as RabbitMQ
        counts them; delivered, what its consumers read; then each consumer and
        the offset it reads next."""
        stream = self.streams[qid]
        stats = stream.log.stats()
        row = [qid, stats.messages, 0, len(stream.core.consumers), 0, stream.appended,
               stream.read, 0, 0, 0, 0, 0, stats.segments, stats.bytes]
        for holder, reader in stream.readers.items():
            row += (holder, reader.offset)
        return row

    def close(self) -> None:
        for stream in self.streams.values():
            try:
                stream.log.close()
            except OSError:
                log.exception("closing stream log %s", stream.log.path)


def _messages(stream: Stream) -> int:
    return stream.log.stats().messages


def stream_path(store_path: str, qid: int) -> str:
    return os.path.join(store_path, "streams", str(qid))


# The header as the codec would write it, but as a long ('l', RabbitMQ's type):
# the codec writes an int in the 32-bit range as 'I'.
_ENTRY = b"\x0fx-stream-offsetl"
_CONTINUED, _CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS = 0x0001, 0x8000, 0x4000, 0x2000


def _with_offset(properties: bytes, offset: int) -> bytes:
    """The publisher's raw properties with the x-stream-offset header (a long),
    spliced into the bytes: the headers table is the third property, and an entry
    appended to it needs only the table's length changed. Decoding and encoding
    every publish's properties cost more than the rest of its append."""
    entry = _ENTRY + offset.to_bytes(8, "big", signed=True)
    size = len(properties)
    if size < 2 or b"x-stream-offset" in properties:
        return _with_offset_decoded(properties, entry)
    flags = int.from_bytes(properties[:2], "big")
    if flags & _CONTINUED:
        return _with_offset_decoded(properties, entry)
    at = 2
    if flags & _CONTENT_TYPE:
        at += 1 + properties[at] if at < size else size + 1
    if flags & _CONTENT_ENCODING:
        at += 1 + properties[at] if at < size else size + 1
    if not flags & _HEADERS:
        if at > size:
            return properties
        return ((flags | _HEADERS).to_bytes(2, "big") + properties[2:at]
                + len(entry).to_bytes(4, "big") + entry + properties[at:])
    end = at + 4 + int.from_bytes(properties[at:at + 4], "big")
    if at + 4 > size or end > size:
        return properties  # malformed: kept as it came, as decoding would
    return (properties[:at] + (end - at - 4 + len(entry)).to_bytes(4, "big")
            + properties[at + 4:end] + entry + properties[end:])


def _with_offset_decoded(properties: bytes, entry: bytes) -> bytes:
    """The header put in by decoding: a table that has it already gets it replaced."""
    try:
        props = decode_properties(properties)
    except PropertiesError:
        return properties
    mark = 1 << 62  # a long's range, replaced by the offset once encoded
    props.headers = {**(props.headers or {}), "x-stream-offset": mark}
    marked = _ENTRY + mark.to_bytes(8, "big", signed=True)
    return encode_properties(props).replace(marked, entry, 1)
