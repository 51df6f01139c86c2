"""Write large synthetic shard statistics logs (schema v1, as shards/stats.py writes them).

    python -m spark.synth OUT_DIR --records 10000000 --shards 4 --queues 1000 [--bad 20]

Queues are placed on shards the way the broker does (xxh64 of vhost NUL name, modulo
the shard count). Every `--interval` seconds each shard writes a queue_stats record per
queue it owns (cumulative counters, gauges) and a shard_stats record (fsync batch
histogram, confirm latency percentiles); events (shard_started, queue_declared,
consumer_added, consumer_timed_out) are sprinkled in. Queue traffic is skewed (a few hot
queues), some queues fall behind and build a backlog, some requeue and redeliver.
`--restarts K` restarts K shards half way through (a shard_started event, counters back
to zero) to exercise the report's reset handling; `--bad N` inserts N corrupted lines.

Files rotate like the broker's: shard-K.jsonl is the newest, shard-K.jsonl.1 older, ...
Exactly `--records` valid records are written (plus the bad lines). OUT_DIR also gets
synth-manifest.json with the true per-queue and per-shard totals.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib

QUEUE_LINE = ('{"v":1,"type":"queue_stats","ts":%.3f,"shard":%d,"vhost":"%s","queue":"%s",'
              '"queue_type":"%s","published":%d,"published_bytes":%d,"delivered":%d,'
              '"redelivered":%d,"acked":%d,"rejected":%d,"requeued":%d,"expired":0,'
              '"dead_lettered":0,"timeouts":%d,"ready":%d,"unacked":%d,"consumers":%d,'
              '"ram_bytes":%d}\n')
SHARD_LINE = ('{"v":1,"type":"shard_stats","ts":%.3f,"shard":%d,"fsyncs":%d,"messages":%d,'
              '"fsync_batch":{%s},"confirm_latency_ms":%s}\n')
EVENT_LINE = '{"v":1,"type":"event","ts":%.3f,"shard":%d,"kind":"%s"%s}\n'


def placement(vhost: str, name: str, shards: int) -> int:
    """The broker's queue placement (gateway/gateway.py)."""
    key = f"{vhost}\0{name}".encode()
    try:
        import xxhash
        return xxhash.xxh64_intdigest(key) % shards
    except ImportError:  # same spread, different shards
        return zlib.crc32(key) % shards


class Queue:
    __slots__ = ("vhost", "name", "shard", "qtype", "rate", "capacity", "size", "requeue_p",
                 "published", "delivered", "redelivered", "acked", "rejected", "requeued",
                 "timeouts", "ready", "unacked", "consumers", "peak_ready",
                 "c_published", "c_delivered", "c_redelivered", "c_acked", "c_rejected",
                 "c_requeued", "c_timeouts", "pending_redeliveries")

    def __init__(self, vhost: str, name: str, shard: int, rng: random.Random):
        self.vhost, self.name, self.shard = vhost, name, shard
        self.qtype = "quorum" if rng.random() < 0.1 else "classic"
        self.rate = max(1, int(rng.paretovariate(1.2) * 20))    # messages per tick
        slow = rng.random() < 0.05                                 # falls behind
        self.capacity = int(self.rate * (0.7 if slow else 1.5)) + 1
        self.size = rng.choice((64, 256, 1024, 4096))
        self.requeue_p = 0.3 if rng.random() < 0.1 else 0.0
        self.consumers = rng.randint(1, 4)
        # true totals since the start (for the manifest) ...
        self.published = self.delivered = self.redelivered = self.acked = 0
        self.rejected = self.requeued = self.timeouts = 0
        self.ready = self.unacked = self.peak_ready = self.pending_redeliveries = 0
        # ... and the cumulative counters the shard reports (reset on restart)
        self.reset()

    def reset(self) -> None:
        self.c_published = self.c_delivered = self.c_redelivered = self.c_acked = 0
        self.c_rejected = self.c_requeued = self.c_timeouts = 0

    def step(self, rng: random.Random) -> int:
        """One interval of traffic; returns how many messages were published."""
        rand = rng.random
        p = int(self.rate * (0.5 + rand()))
        self.ready += p
        d = min(self.ready, int(self.capacity * (0.6 + 0.8 * rand())))
        self.ready -= d
        r = min(d, self.pending_redeliveries)  # requeued earlier, delivered again now
        self.pending_redeliveries -= r
        q = int(d * self.requeue_p * rand()) if self.requeue_p else 0
        rej = 1 if d and rand() < 0.01 else 0
        q = min(q, d - rej)
        a = d - q - rej
        self.ready += q
        self.pending_redeliveries += q
        self.unacked = min(d, self.consumers * 10) if d else 0
        if self.ready > self.peak_ready:
            self.peak_ready = self.ready
        self.published += p
        self.delivered += d
        self.redelivered += r
        self.acked += a
        self.rejected += rej
        self.requeued += q
        self.c_published += p
        self.c_delivered += d
        self.c_redelivered += r
        self.c_acked += a
        self.c_rejected += rej
        self.c_requeued += q
        return p

    def line(self, ts: float) -> str:
        return QUEUE_LINE % (ts, self.shard, self.vhost, self.name, self.qtype, self.c_published,
                             self.c_published * self.size, self.c_delivered, self.c_redelivered,
                             self.c_acked, self.c_rejected, self.c_requeued, self.c_timeouts,
                             self.ready, self.unacked, self.consumers, self.ready * self.size)


class ShardFiles:
    """One shard's log, rotated at `max_bytes`; renamed broker-style at close."""

    def __init__(self, out_dir: str, shard: int, max_bytes: int):
        self.out_dir, self.shard, self.max_bytes = out_dir, shard, max_bytes
        self.parts: list[str] = []
        self.file = None
        self.size = 0
        self._next_part()

    def _next_part(self) -> None:
        if self.file:
            self.file.close()
        path = os.path.join(self.out_dir, f".shard-{self.shard}.part{len(self.parts)}")
        self.parts.append(path)
        self.file = open(path, "w", buffering=1 << 20)
        self.size = 0

    def write(self, text: str) -> None:
        self.file.write(text)
        self.size += len(text)
        if self.size >= self.max_bytes:
            self._next_part()

    def close(self) -> list[str]:
        self.file.close()
        parts = [p for p in self.parts if os.path.getsize(p) or len(self.parts) == 1]
        for p in self.parts:
            if p not in parts:
                os.remove(p)
        names = []
        for i, part in enumerate(parts):
            age = len(parts) - 1 - i  # the last part is the live file
            name = f"shard-{self.shard}.jsonl" + (f".{age}" if age else "")
            os.replace(part, os.path.join(self.out_dir, name))
            names.append(name)
        return names


def corrupt_line(kind: int, rng: random.Random, ts: float, shard: int) -> str:
    good = EVENT_LINE % (ts, shard, "consumer_added", ',"vhost":"/","queue":"q"')
    return (
        lambda: good[: rng.randint(5, len(good) - 3)] + "\n",          # truncated write
        lambda: "garbage ### not json\n",                            # garbage
        lambda: '{"v":1,"ts":%.3f,"shard":%d,"kind":"alarm"}\n' % (ts, shard),  # no type
        lambda: '{"v":99,"type":"queue_stats","ts":%.3f,"shard":%d}\n' % (ts, shard),
        lambda: '[1,2,3]\n',                                         # not an object
    )[kind % 5]()


def generate(out_dir: str, records: int, shards: int = 4, queues: int = 1000,
             interval: float = 5.0, bad: int = 0, restarts: int = 0, seed: int = 1,
             start: float = 1_700_000_000.0, max_bytes: int = 256 << 20,
             vhosts: int = 2, overwrite: bool = False) -> dict:
    """Write the logs and synth-manifest.json; returns the manifest. Existing shard
    logs in `out_dir` are an error unless `overwrite` (then they are removed)."""
    os.makedirs(out_dir, exist_ok=True)
    existing = [n for n in os.listdir(out_dir) if n.startswith("shard-") and ".jsonl" in n]
    if existing and not overwrite:
        raise FileExistsError(f"{out_dir} already holds shard logs ({existing[0]}, ...); "
                              "pass --overwrite to replace them")
    for name in existing:
        os.remove(os.path.join(out_dir, name))
    rng = random.Random(seed)
    names = ["/"] + [f"vh{i}" for i in range(1, vhosts)]
    qs = []
    for i in range(queues):
        vhost = names[i % len(names)]
        name = f"q{i:05d}"
        qs.append(Queue(vhost, name, placement(vhost, name, shards), rng))
    by_shard = [[q for q in qs if q.shard == s] for s in range(shards)]
    files = [ShardFiles(out_dir, s, max_bytes) for s in range(shards)]
    fsyncs = [0] * shards
    messages = [0] * shards
    latency_p50 = [rng.uniform(0.5, 3.0) for _ in range(shards)]

    # bad lines go in after random valid records
    bad_after = sorted(rng.randrange(max(records, 1)) for _ in range(bad))
    written = 0
    bad_written = 0
    counts = {"queue_stats": 0, "shard_stats": 0, "event": 0}
    events: dict[str, int] = {}
    timed_out: dict[tuple[str, str], int] = {}

    def emit(shard: int, text: str, kind: str) -> bool:
        nonlocal written, bad_written
        if written >= records:
            return False
        files[shard].write(text)
        written += 1
        counts[kind] += 1
        while bad_written < bad and bad_after[bad_written] < written:
            files[shard].write(corrupt_line(bad_written, rng, ts, shard))
            bad_written += 1
        return True

    def event(shard: int, kind: str, extra: str = "") -> bool:
        if not emit(shard, EVENT_LINE % (ts, shard, kind, extra), "event"):
            return False
        events[kind] = events.get(kind, 0) + 1
        return True

    ts = start
    for s in range(shards):
        event(s, "shard_started")
        for q in by_shard[s]:
            event(s, "queue_declared", ',"vhost":"%s","queue":"%s","durable":true'
                  % (q.vhost, q.name))
            event(s, "consumer_added", ',"vhost":"%s","queue":"%s","consumer_tag":"ctag-1"'
                  % (q.vhost, q.name))
    per_tick = queues + shards
    ticks_total = max(1, (records - written) // per_tick)
    restart_tick = ticks_total // 2 if restarts else -1
    restarted = list(range(min(restarts, shards)))
    tick = 0
    while written < records:
        tick += 1
        ts = start + tick * interval
        if tick == restart_tick:
            for s in restarted:
                event(s, "shard_started")
                for q in by_shard[s]:
                    q.reset()
                fsyncs[s] = messages[s] = 0
        for s in range(shards):
            stored = 0
            for q in by_shard[s]:
                if written >= records:  # only what is logged counts in the manifest
                    break
                p = q.step(rng)
                timed_out_now = (q.capacity < q.rate and q.ready > 50 * q.rate
                                 and rng.random() < 0.02)
                if timed_out_now:
                    q.timeouts += 1
                    q.c_timeouts += 1
                if q.qtype == "quorum" or q.shard % 2 == 0:
                    stored += p
                emit(s, q.line(ts), "queue_stats")
                if timed_out_now and event(s, "consumer_timed_out", ',"vhost":"%s","queue":"%s"'
                                           % (q.vhost, q.name)):
                    key = (q.vhost, q.name)
                    timed_out[key] = timed_out.get(key, 0) + 1
            batches = {}
            left = stored
            while left > 0:
                n = min(left, rng.choice((1, 1, 2, 3, 5, 8, 16, 40, 100)))
                bucket = 1 << max(n - 1, 0).bit_length()
                batches[bucket] = batches.get(bucket, 0) + 1
                fsyncs[s] += 1
                messages[s] += n
                left -= n
            hist = ",".join('"%d":%d' % kv for kv in sorted(batches.items()))
            if stored:
                p50 = latency_p50[s] * rng.uniform(0.8, 1.25)
                lat = '{"p50":%.3f,"p90":%.3f,"p99":%.3f,"max":%.3f}' % (
                    p50, p50 * 2.1, p50 * 4.5, p50 * rng.uniform(5, 12))
            else:
                lat = "{}"
            emit(s, SHARD_LINE % (ts, s, fsyncs[s], messages[s], hist, lat), "shard_stats")
    while bad_written < bad:  # with tiny --records
        files[0].write(corrupt_line(bad_written, rng, ts, 0))
        bad_written += 1
    names = [n for f in files for n in f.close()]
    manifest = {
        "records": written, "bad_lines": bad_written, "records_by_type": counts,
        "events_by_kind": events, "files": sorted(names), "shards": shards,
        "interval": interval, "restarted_shards": restarted if restarts else [],
        "queues": [{"vhost": q.vhost, "name": q.name, "shard": q.shard,
                    "published": q.published, "delivered": q.delivered,
                    "redelivered": q.redelivered, "acked": q.acked, "rejected": q.rejected,
                    "requeued": q.requeued, "timeouts": q.timeouts,
                    "timeout_events": timed_out.get((q.vhost, q.name), 0),
                    "peak_ready": q.peak_ready}
                   for q in qs],
    }
    with open(os.path.join(out_dir, "synth-manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.synth",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--records", type=int, default=100_000,
                        help="valid records to write (default 100000)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="stats interval (s)")
    parser.add_argument("--bad", type=int, default=0, help="corrupted lines to insert")
    parser.add_argument("--restarts", type=int, default=0,
                        help="shards restarted half way (their counters reset)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-bytes", type=int, default=256 << 20,
                        help="rotate a shard's file at this size (default 256 MiB)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace shard logs already in OUT_DIR")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        manifest = generate(args.out_dir, args.records, args.shards, args.queues,
                            args.interval, args.bad, args.restarts, args.seed,
                            max_bytes=args.max_bytes, overwrite=args.overwrite)
    except FileExistsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    size = sum(os.path.getsize(os.path.join(args.out_dir, n)) for n in manifest["files"])
    print(f"wrote {manifest['records']:,} records + {manifest['bad_lines']} bad lines "
          f"({size / 1e6:,.1f} MB, {len(manifest['files'])} files) to {args.out_dir} "
          f"in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
