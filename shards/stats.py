"""A shard's statistics log: JSON lines in DATA/logs/shard-K.jsonl.

The shard's loop only encodes lines and hands them to a queue; a background
thread owns the file, writes, flushes and rotates it (shard-K.jsonl ->
shard-K.jsonl.1 -> ... up to `backups`), so a slow disk never stalls the loop.
A write the disk refuses (full) drops its lines, cut back to the last whole
line, and the thread goes on: statistics are not worth the shard, and a full
disk is the disk alarm's to report. It says so once, and again once it writes.

Record schema, version 1 (every record has "v", "type", "ts" in unix seconds
and "shard"):
* queue_stats: vhost, queue, queue_type, cumulative counters (published,
  published_bytes, delivered, redelivered, acked, rejected, requeued, expired,
  dead_lettered, timeouts) and gauges (ready, unacked, consumers, ram_bytes). A
  stream's: its appends as published, its reads as delivered, its log's records
  as ready, and the gauges segments and disk_bytes.
* shard_stats: fsyncs and messages (cumulative), fsync_batch (histogram of
  messages per fsync in this interval, keyed by power-of-two upper bound),
  confirm_latency_ms (p50, p90, p99, max of this interval).
* event: kind plus its fields (queue_declared, queue_deleted, consumer_added,
  consumer_cancelled, consumer_timed_out, shard_started, shard_recovered, alarm).
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import threading
import time

import msgspec

log = logging.getLogger("warren.shard")

SCHEMA_VERSION = 1
_COUNTERS = ("published", "published_bytes", "delivered", "redelivered", "acked", "rejected",
             "requeued", "expired", "dead_lettered", "timeouts")


class StatsLog:
    def __init__(self, log_dir: str, shard: int, interval: float = 5.0,
                 max_bytes: int = 64 << 20, backups: int = 5):
        self.log_dir = log_dir
        self.path = os.path.join(log_dir, f"shard-{shard}.jsonl")
        self.shard = shard
        self.interval = interval
        self.max_bytes = max_bytes
        self.backups = backups
        self.dropped = 0  # lines the disk refused since the last that it took
        self._encode = msgspec.json.Encoder().encode
        self._lines: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.next_at = 0.0  # when tick() next writes (the loop asks before calling it)
        self.streams = None  # the shard's Streams (shards/streams.py), logged with its queues
        self._writer = threading.Thread(target=self._write_lines, name=f"stats-{shard}",
                                        daemon=True)
        self._writer.start()

    # -- what the loop reports -------------------------------------------------

    def event(self, kind: str, **fields) -> None:
        self._put({"v": SCHEMA_VERSION, "type": "event", "ts": time.time(), "shard": self.shard,
                   "kind": kind, **fields})

    def tick(self, now: float, queues, commits, force: bool = False) -> None:
        """Write the interval's records when the interval has passed (or `force`,
        on stop); cheap otherwise. `now` is the loop's monotonic clock (the loop
        has it already); the records carry the wall clock. `commits` is the
        shard's GroupCommit."""
        if now < self.next_at and not force:
            return
        self.next_at = now + self.interval
        wall = time.time()
        if self.streams is not None:
            for stream in self.streams.streams.values():
                self._put(self._stream_record(wall, stream))
        for q in queues:
            counters = q.counters
            record = {"v": SCHEMA_VERSION, "type": "queue_stats", "ts": wall,
                      "shard": self.shard, "vhost": q.spec.vhost, "queue": q.spec.name,
                      "queue_type": q.arguments.get("x-queue-type", "classic")}
            for name in _COUNTERS:
                record[name] = getattr(counters, name, 0)
            record.update(ready=q.ready_count, unacked=q.unacked_count,
                          consumers=len(q.consumers), ram_bytes=q.ram_bytes)
            self._put(record)
        batches, latencies = commits.take_interval()
        self._put({"v": SCHEMA_VERSION, "type": "shard_stats", "ts": wall, "shard": self.shard,
                   "fsyncs": commits.fsyncs, "messages": commits.messages,
                   "fsync_batch": {str(k): v for k, v in sorted(batches.items())},
                   "confirm_latency_ms": _percentiles(latencies)})

    def _stream_record(self, wall: float, stream) -> dict:
        stats = stream.log.stats()
        record = {"v": SCHEMA_VERSION, "type": "queue_stats", "ts": wall, "shard": self.shard,
                  "vhost": stream.spec.vhost, "queue": stream.spec.name, "queue_type": "stream"}
        record.update(dict.fromkeys(_COUNTERS, 0))
        record.update(published=stream.appended, published_bytes=stream.appended_bytes,
                      delivered=stream.read, ready=stats.messages, unacked=0,
                      consumers=len(stream.core.consumers), ram_bytes=0,
                      segments=stats.segments, disk_bytes=stats.bytes)
        return record

    def close(self) -> None:
        self._lines.put(None)
        self._writer.join(10)

    # -- the writer thread -----------------------------------------------------

    def _put(self, record: dict) -> None:
        self._lines.put(self._encode(record) + b"\n")

    def _write_lines(self) -> None:
        fd = None
        try:
            while True:
                lines = [self._lines.get()]
                while not self._lines.empty():  # write what piled up at once
                    lines.append(self._lines.get())
                stop = None in lines
                if stop:
                    lines = lines[:lines.index(None)]
                fd = self._write(fd, lines)
                if stop:
                    break
        finally:
            if fd is not None:
                os.close(fd)

    def _write(self, fd: int | None, lines: list[bytes]) -> int | None:
        """Append the lines (rotating first if the file is full): the descriptor to
        write with next, None if it failed (opened again next time)."""
        if not lines:
            return fd
        size = None
        try:
            if fd is None:
                os.makedirs(self.log_dir, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                             0o644)
            size = os.fstat(fd).st_size
            if size >= self.max_bytes:
                os.close(fd)
                fd = None
                self._rotate()
                return self._write(None, lines)
            data = b"".join(lines)
            written = 0
            while written < len(data):  # a short write is followed by ENOSPC's error
                written += os.write(fd, data[written:])
        except OSError as error:
            if fd is not None and size is not None:
                try:  # no torn line left behind; freeing blocks needs no space
                    os.ftruncate(fd, size)
                except OSError:
                    pass
            if not self.dropped:
                log.warning("statistics log %s: cannot write (%s): dropping its lines "
                            "until it can", self.path, error.strerror or error)
            self.dropped += len(lines)
            if fd is not None:
                os.close(fd)
            return None
        if self.dropped:
            log.warning("statistics log %s: writing again, %d lines dropped",
                        self.path, self.dropped)
            self.dropped = 0
        return fd

    def _rotate(self) -> None:
        for n in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{n}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}
