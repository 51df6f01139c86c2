"""A real shard process over rings this test process holds, started as the
gateway starts one (warren.shards.main, its spec on stdin): the test plays the
gateways at the rings' other ends, one RingEnd each."""

from __future__ import annotations

import os
import select
import time

import msgspec

from warren.gateway.io.children import spawn
from warren.shards import records as r
from warren.shards.codec import decode_events, encode_batch
from warren.shards.ring import Ring


class RingEnd:
    """One gateway process's end of a shard: its two rings, records out, events in."""

    def __init__(self, commands: Ring, events: Ring):
        self.commands = commands
        self.events = events

    def send(self, records: list) -> None:
        while not self.commands.write_many([encode_batch(records)]):
            time.sleep(0.001)  # the tests send far less than a ring holds
        self.commands.flush()

    def receive(self, timeout: float) -> list:
        """The shard's events; wait up to `timeout` if there are none."""
        batches = self.events.read_many()
        if not batches and self.events.sleep():
            select.select([self.events.spec().data_fd], [], [], timeout)
            self.events.clear_data_doorbell()
            batches = self.events.read_many()
        return [event for batch in batches for event in decode_events(batch)]


class ShardProcess:
    """Shard 0 serving `gateways` gateways' rings (`ends`) in a data dir."""

    def __init__(self, data_dir: str, gateways: int = 1, memory_limit: int = 0):
        self._doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.ends = [RingEnd(Ring.create(16 << 20, self._doorbell), Ring.create(16 << 20))
                     for _ in range(gateways)]
        lifeline_read, self._lifeline = os.pipe()
        spec = r.ShardSpec(0, data_dir, [r.RingPair(end.commands.spec(), end.events.spec())
                                         for end in self.ends],
                           lifeline_read, [0], memory_limit, stats_interval=60.0)
        fds = [self._doorbell, lifeline_read]
        for end in self.ends:
            fds += [end.commands.spec().space_fd, end.events.spec().data_fd,
                    end.events.spec().space_fd]
        self.process = spawn("warren.shards.main", msgspec.json.encode(spec), fds, "0")
        os.close(lifeline_read)

    def stop(self) -> None:
        self.ends[0].send([r.Stop()])
        try:
            self.process.wait(60)
        finally:
            os.close(self._lifeline)
            for end in self.ends:
                for ring in (end.commands, end.events):
                    ring.close()
                    ring.unlink()
            os.close(self._doorbell)
