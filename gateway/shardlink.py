"""The gateway's end of one shard: its process, its two rings, batching.

Records for the shard collect during a loop turn and go out as one msgpack
array, one ring write and one doorbell. A full command ring is backpressure:
the connections that fed this shard stop being read until the shard frees
space (its space doorbell). Events from the shard arrive on the event ring's
doorbell and are handed to the broker in batches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Callable

import msgspec

from shards import records as r
from shards.main import ShardSpec
from shards.ring import Ring

log = logging.getLogger("warren.shard")

COMMAND_RING_BYTES = 16 * 1024 * 1024
EVENT_RING_BYTES = 16 * 1024 * 1024


class ShardLink:
    def __init__(self, index: int, data_dir: str, stores: list[int], memory_limit: int,
                 stats_interval: float, store_map_size: int, on_events: Callable,
                 on_exit: Callable, log_dir: str = ""):
        self.index = index
        self.log_dir = log_dir
        self.data_dir = data_dir
        self.stores = stores
        self.memory_limit = memory_limit
        self.stats_interval = stats_interval
        self.store_map_size = store_map_size
        self._on_events = on_events  # (link, events) -> None
        self._on_exit = on_exit  # (link, returncode) -> None
        self._loop = asyncio.get_running_loop()
        self._batch: list = []
        self._pending: list[bytes] = []  # encoded batches waiting for ring space
        self._flush_scheduled = False
        self.feeders: set = set()  # connections that sent records since the last flush
        self.paused: set = set()  # connections paused because this ring was full
        self.process: subprocess.Popen | None = None
        self.alive = False
        self._next_req = 0
        self._waiters: dict[int, Callable] = {}

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.commands = Ring.create(COMMAND_RING_BYTES)
        self.events = Ring.create(EVENT_RING_BYTES)
        lifeline_read, self._lifeline_write = os.pipe()
        spec = ShardSpec(self.index, self.data_dir, self.commands.spec(), self.events.spec(),
                         lifeline_read, self.stores, self.memory_limit, self.stats_interval,
                         self.store_map_size, self.log_dir)
        fds = [self.commands.spec().data_fd, self.commands.spec().space_fd,
               self.events.spec().data_fd, self.events.spec().space_fd, lifeline_read]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shards.main", msgspec.json.encode(spec).decode()],
            pass_fds=fds)
        os.close(lifeline_read)
        self._pidfd = os.pidfd_open(self.process.pid)
        self._loop.add_reader(self._pidfd, self._process_exited)
        self._loop.add_reader(self.events.spec().data_fd, self._read_events)
        self.alive = True
        self._read_events()  # arms the doorbell (tells the shard we sleep)

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask the shard to finish its work and exit; kill it if it will not."""
        if not self.alive:
            return
        self.send(r.Stop())
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

    def _teardown(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._loop.remove_reader(self.events.spec().data_fd)
        self._loop.remove_reader(self.commands.spec().space_fd)
        os.close(self._lifeline_write)
        for ring in (self.commands, self.events):
            ring.close()
            ring.unlink()
        self._batch.clear()
        self._pending.clear()
        waiters, self._waiters = self._waiters, {}
        for callback in waiters.values():
            callback(r.Reply(0, 541, "INTERNAL_ERROR - shard process stopped"))
        self._resume_paused()

    # -- commands out ----------------------------------------------------------

    def next_req(self) -> int:
        self._next_req += 1
        return self._next_req

    def request(self, make: Callable[[int], object], callback: Callable) -> None:
        """Send the command `make(req)` and call `callback(reply)` when it is answered."""
        if not self.alive:
            callback(r.Reply(0, 541, "INTERNAL_ERROR - shard process unavailable"))
            return
        req = self.next_req()
        self._waiters[req] = callback
        self.send(make(req))

    def send(self, record, feeder=None) -> None:
        if not self.alive:
            return
        self._batch.append(record)
        if feeder is not None:
            self.feeders.add(feeder)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self.alive:
            return
        if self._batch:
            self._pending.append(r.encode_batch(self._batch))
            self._batch = []
        if self._pending or self.commands.backlogged():
            written = self.commands.write_many(self._pending)
            self.commands.flush()
            del self._pending[:written]
        if self._pending or self.commands.backlogged():
            self._apply_backpressure()
        self.feeders.clear()

    def _apply_backpressure(self) -> None:
        for conn in self.feeders:
            if conn not in self.paused:
                self.paused.add(conn)
                conn.pause_for_shard(self)
        if self.commands.want_space():
            self._loop.add_reader(self.commands.spec().space_fd, self._space_available)
        else:
            self._loop.call_soon(self._space_available)

    def _space_available(self) -> None:
        self._loop.remove_reader(self.commands.spec().space_fd)
        if not self.alive:
            return
        self.commands.clear_space_doorbell()
        self.flush()
        if not self._pending and not self.commands.backlogged():
            self._resume_paused()

    def _resume_paused(self) -> None:
        paused, self.paused = self.paused, set()
        for conn in paused:
            conn.resume_for_shard(self)

    # -- events in -------------------------------------------------------------

    def _read_events(self) -> None:
        if not self.alive:
            return
        self.events.clear_data_doorbell()
        while True:
            batches = self.events.read_many()
            if batches:
                events = []
                for batch in batches:
                    events.extend(r.decode_events(batch))
                self._dispatch(events)
                if not self.alive:
                    return
            elif self.events.sleep():
                return

    def _dispatch(self, events: list) -> None:
        """Hand events over in the shard's order: a reply (say cancel-ok) must not
        overtake the deliveries the shard emitted before it."""
        plain = []
        for event in events:
            kind = type(event)
            if kind is r.Reply or kind is r.GetReply or kind is r.QueueInfoReply:
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
