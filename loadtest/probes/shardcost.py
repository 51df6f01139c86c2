"""What a shard spends per durable message, measured without a gateway or a client.

`python -m warren.loadtest.probes.shardcost` starts one real shard process over its two
rings and plays the gateway itself: one publisher sends persistent messages with
publisher confirms (a window of outstanding confirms, and the gateway's credit:
PUBLISH_CREDIT units, PERSISTENT_COST per persistent publish, back on
Progress), and one consumer with manual acks and a prefetch acks each delivery
(one Settle per message, as the gateway sends one per basic.ack) `--ack-delay`
milliseconds after the delivery, the round trip through the gateway and the
client that a real consumer adds. It reports
the shard process's CPU seconds per message (user + system, all its threads,
from /proc), fsyncs per message, messages per commit and the confirm latency
distribution. CPU time per message holds on a loaded machine where rates do
not; the load average is printed beside it.

With `--round-trip`, the driver publishes transient messages one at a time to
an autoack consumer and waits for each delivery before the next: one message a
shard turn, the shape of a steady rate, where the turn's own cost (waking,
reading the ring, the loop's bookkeeping, writing the events, sleeping) is most
of what a message costs.

With `--profile`, the shard runs under cProfile with a per-thread CPU clock
(its loop and the committer thread each profiled, then merged), and the top
functions by self time are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque

import msgspec

from warren.shards import records as r
from warren.shards.codec import decode_events, encode_batch
from warren.shards.records import PERSISTENT_COST, PUBLISH_CREDIT
from warren.shards.ring import Ring
from warren.storage.queuespec import QueueSpec

from ..procs import CLOCK_TICKS, tree_cpu

QID = 1
HOLDER = 10
CHANNEL = 1
PUBLISHES_PER_TURN = 30  # the gateway reads 90 frames a turn: 30 publishes of 3 frames
FLOW_WINDOW = 2000  # the gateway's delivery window towards one consumer
PERSISTENT_PROPERTIES = b"\x10\x00\x02"  # basic properties: delivery-mode 2 only


class RingEnd:
    """One gateway process's end of a shard: its two rings, records out, events in."""

    def __init__(self, commands: Ring, events: Ring):
        self.commands = commands
        self.events = events
        self.records_sent = 0

    def send(self, records: list) -> None:
        self.records_sent += 1
        while not self.commands.write_many([encode_batch(records)]):
            time.sleep(0.001)  # credit keeps the ring far from full
        self.commands.flush()

    def receive(self, timeout: float) -> list:
        """The shard's events; wait up to `timeout` if there are none."""
        batches = self.events.read_many()
        if not batches and self.events.sleep():
            select.select([self.events.spec().data_fd], [], [], timeout)
            self.events.clear_data_doorbell()
            batches = self.events.read_many()
        return [event for batch in batches for event in decode_events(batch)]


class Driver:
    """The gateway's part: rings, credit, confirms, acks; and the figures. With
    `gateways`, the shard has that many gateways' rings (`ends`); the driver
    plays gateway 0."""

    def __init__(self, data_dir: str, profile: str | None = None, gateways: int = 1,
                 memory_limit: int = 0):
        self._doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.ends = [RingEnd(Ring.create(16 << 20, self._doorbell), Ring.create(16 << 20))
                     for _ in range(gateways)]
        self.commands, self.events = self.ends[0].commands, self.ends[0].events
        lifeline_read, self._lifeline = os.pipe()
        spec = r.ShardSpec(0, data_dir, [r.RingPair(end.commands.spec(), end.events.spec())
                                         for end in self.ends],
                           lifeline_read, [0], memory_limit, stats_interval=60.0)
        fds = [self._doorbell, lifeline_read]
        for end in self.ends:
            fds += [end.commands.spec().space_fd, end.events.spec().data_fd,
                    end.events.spec().space_fd]
        argv = [sys.executable, "-m", "warren.loadtest.probes.shardcost", "--serve",
                msgspec.json.encode(spec).decode()]
        if profile:
            argv += ["--profile", profile]
        self.process = subprocess.Popen(argv, pass_fds=fds)
        os.close(lifeline_read)
        self.replies: dict[int, r.Event] = {}
        self.unreturned: list[tuple[int, int]] = []  # (record number, credit units)
        self.credit = PUBLISH_CREDIT
        self.sent_at: dict[int, float] = {}  # confirm seq -> when published
        self.latencies: list[float] = []
        self.confirmed = 0
        self.nacked = 0
        self.to_ack: deque[tuple[float, int]] = deque()  # (when to ack, seq)
        self.ack_delay = 0.0
        self.no_ack = False  # the consumer's (round_trip's is autoack)
        self.delivered = 0
        self.acked = 0
        self.turns = 0  # shard turns that took commands (one Progress each)

    @property
    def records_sent(self) -> int:
        return self.ends[0].records_sent

    def send(self, records: list) -> None:
        self.ends[0].send(records)

    def poll(self, timeout: float) -> None:
        """Take in the shard's events; wait up to `timeout` if there are none."""
        events = self.ends[0].receive(timeout)
        now = time.monotonic()
        for event in events:
            kind = type(event)
            if kind is r.Deliver:
                self.delivered += 1
                if not self.no_ack:
                    self.to_ack.append((now + self.ack_delay, event.seq))
            elif kind is r.Confirmed or kind is r.Rejected:
                for seq in event.seqs:
                    self.latencies.append(now - self.sent_at.pop(seq))
                if kind is r.Confirmed:
                    self.confirmed += len(event.seqs)
                else:
                    self.nacked += len(event.seqs)
            elif kind is r.Progress:
                self.turns += 1
                while self.unreturned and self.unreturned[0][0] <= event.records:
                    self.credit += self.unreturned.pop(0)[1]
            elif kind is r.Reply or kind is r.QueueInfoReply:
                self.replies[event.req] = event

    def request(self, record) -> r.Event:
        self.send([record])
        deadline = time.monotonic() + 30
        while record.req not in self.replies:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the shard did not answer")
            self.poll(0.1)
        return self.replies.pop(record.req)

    def info(self) -> r.QueueInfoReply:
        return self.request(r.QueueInfo(1000 + self.records_sent, [QID]))

    def run(self, messages: int, window: int, prefetch: int, body: bytes,
            ack_delay: float) -> float:
        """Publish `messages` with confirms while the consumer acks each one
        `ack_delay` seconds after its delivery; the seconds it took."""
        self.ack_delay = ack_delay
        spec = QueueSpec("/", "shardcost", True, False, False, {})
        self.request(r.CreateQueue(1, QID, spec, spec.arguments))
        self.request(r.Consume(2, QID, HOLDER, CHANNEL, "c", False, False, prefetch,
                               FLOW_WINDOW))
        started = time.monotonic()
        next_seq = 1
        while self.acked < messages or self.confirmed + self.nacked < messages:
            turn: list = []
            now = time.monotonic()
            acks = 0
            while self.to_ack and self.to_ack[0][0] <= now:  # one Settle per basic.ack
                turn.append(r.Settle(QID, HOLDER, [self.to_ack.popleft()[1]], r.SETTLE_ACK))
                acks += 1
            if acks:  # and the delivery window back for what was written
                turn.append(r.Grant(QID, HOLDER, acks))
                self.acked += acks
            count = min(PUBLISHES_PER_TURN, messages + 1 - next_seq,
                        window - len(self.sent_at), max(0, self.credit) // PERSISTENT_COST)
            for seq in range(next_seq, next_seq + count):
                turn.append(r.Publish([QID], "", "shardcost", PERSISTENT_PROPERTIES, body, True,
                                      CHANNEL, seq))
                self.sent_at[seq] = now
            next_seq += count
            if turn:
                self.send(turn)
                if count:
                    self.credit -= count * PERSISTENT_COST
                    self.unreturned.append((self.records_sent, count * PERSISTENT_COST))
            if self.process.poll() is not None:
                raise RuntimeError("the shard exited")
            self.poll(max(0.0, self.to_ack[0][0] - time.monotonic()) if self.to_ack else 1.0)
        return time.monotonic() - started

    def round_trip(self, messages: int, body: bytes) -> float:
        """Publish `messages` transient messages one at a time to a queue with an
        autoack consumer, each delivered before the next goes: a steady rate's
        shape, one message a turn. The seconds it took."""
        self.no_ack = True
        spec = QueueSpec("/", "shardcost", False, False, False, {})
        self.request(r.CreateQueue(1, QID, spec, spec.arguments))
        self.request(r.Consume(2, QID, HOLDER, CHANNEL, "c", True, False, 0, FLOW_WINDOW))
        publish = r.Publish([QID], "", "shardcost", b"\x00\x00", body, False)
        started = time.monotonic()
        for sent in range(1, messages + 1):
            self.send([publish] if sent % (FLOW_WINDOW // 2) else
                      [r.Grant(QID, HOLDER, FLOW_WINDOW // 2), publish])  # window back
            while self.delivered < sent:
                if self.process.poll() is not None:
                    raise RuntimeError("the shard exited")
                self.poll(1.0)
        return time.monotonic() - started

    def stop(self) -> None:
        self.send([r.Stop()])
        try:
            self.process.wait(60)
        finally:
            os.close(self._lifeline)
            for end in self.ends:
                for ring in (end.commands, end.events):
                    ring.close()
                    ring.unlink()
            os.close(self._doorbell)


def thread_cpu(pid: int, tid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one thread of a process (the main thread's tid
    is the pid)."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


def measure(messages: int, window: int, prefetch: int, body_size: int, ack_delay: float,
            profile: str | None = None, round_trip: bool = False) -> dict:
    data_dir = tempfile.mkdtemp(prefix="warren-shardcost-")
    try:
        driver = Driver(data_dir, profile)
        try:
            before = driver.info()
            pid = driver.process.pid
            cpu, (loop_user, loop_system) = tree_cpu([pid]), thread_cpu(pid, pid)
            if round_trip:
                seconds = driver.round_trip(messages, b"x" * body_size)
            else:
                seconds = driver.run(messages, window, prefetch, b"x" * body_size, ack_delay)
            cpu = tree_cpu([pid]) - cpu
            user, system = thread_cpu(pid, pid)
            loop_user, loop_system = user - loop_user, system - loop_system
            after = driver.info()
        finally:
            driver.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    fsyncs = after.fsyncs - before.fsyncs
    lat = driver.latencies
    return {
        "messages": messages, "seconds": round(seconds, 3),
        "rate": round(messages / seconds), "nacked": driver.nacked,
        "shard_cpu_us_per_msg": round(cpu / messages * 1e6, 1),
        # its loop's share (user, system); the rest is the committer thread's
        "loop_cpu_us_per_msg": [round(loop_user / messages * 1e6, 1),
                                round(loop_system / messages * 1e6, 1)],
        "msgs_per_turn": round(messages / driver.turns, 1) if driver.turns else None,
        "fsyncs": fsyncs, "fsyncs_per_msg": round(fsyncs / messages, 4),
        "msgs_per_commit": round(messages / fsyncs, 1) if fsyncs else None,
        "records_per_commit": round((after.messages - before.messages) / fsyncs, 1)
        if fsyncs else None,
        "confirm_ms": {name: round(percentile(lat, p) * 1000, 2)
                       for name, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99),
                                       ("max", 1.0))},
        "loadavg": round(os.getloadavg()[0], 2),
    }


def serve_profiled(spec: r.ShardSpec, out: str) -> None:
    """The shard's serve(), its loop and its committer thread each under cProfile
    with that thread's CPU clock; the merged statistics go to `out`."""
    from warren.shards import committer as committer_module
    from warren.shards import main as shard_main

    loop_profile = cProfile.Profile(time.thread_time)
    thread_profile = cProfile.Profile(time.thread_time)
    work = committer_module.Committer._work

    def profiled_work(self) -> None:
        thread_profile.enable()
        try:
            work(self)
        finally:
            thread_profile.disable()

    committer_module.Committer._work = profiled_work
    loop_profile.enable()
    try:
        shard_main.serve(spec)
    finally:
        loop_profile.disable()
        stats = pstats.Stats(loop_profile)
        stats.add(thread_profile)
        stats.dump_stats(out)


def print_top(path: str, count: int) -> None:
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.shardcost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=1000, help="outstanding confirms")
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--ack-delay", type=float, default=5.0,
                        help="milliseconds from a delivery to its ack")
    parser.add_argument("--round-trip", action="store_true",
                        help="transient messages one at a time to an autoack consumer, "
                        "each delivered before the next (the other options but "
                        "--messages and --body-size do not apply)")
    parser.add_argument("--profile", metavar="FILE", help="profile the shard into FILE")
    parser.add_argument("--top", type=int, default=15, help="profile lines to print")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--serve", metavar="SPEC", help=argparse.SUPPRESS)  # the shard side
    args = parser.parse_args(argv)
    if args.serve:
        spec = msgspec.json.decode(args.serve, type=r.ShardSpec)
        os.set_blocking(spec.lifeline_fd, False)
        if args.profile:
            serve_profiled(spec, args.profile)
        else:
            from warren.shards.main import serve
            serve(spec)
        return
    result = measure(args.messages, args.window, args.prefetch, args.body_size,
                     args.ack_delay / 1000, args.profile, args.round_trip)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:22} {value}")
    if args.profile:
        print_top(args.profile, args.top)


if __name__ == "__main__":
    main()
