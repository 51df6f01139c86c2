"""RabbitMQ's resource alarms: memory (raised by the shards) and free disk (watched
here). While any alarm is on, every connection that publishes is blocked."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable

from warren.storage.shardstore import reusable_bytes

log = logging.getLogger("warren")

# The disk is checked at most this many seconds apart, and sooner as free space
# nears the limit: twice the time a writer at FASTEST_WRITE takes to use up the
# margin, at least DISK_CHECK_MIN apart (RabbitMQ's disk monitor: 100 ms, 250 MB/s).
# At a fixed second, a 50 MB/s flood filled a 52 MB disk under a 30 MB limit.
DISK_CHECK_INTERVAL = 1.0
DISK_CHECK_MIN = 0.1
FASTEST_WRITE = 250e6  # bytes a second


class Alarms:
    def __init__(self, on_change: Callable[[str], None], logs: bool = True):
        self.active: set[tuple] = set()  # (source, resource): a shard index or "gateway"
        self._on_change = on_change  # (reason, "" once all are off) -> None
        # Every gateway process sees every alarm; one (gateway 0) tells the log, as
        # a RabbitMQ node logs it once.
        self._logs = logs
        self.disk_free = 0  # bytes, as of the last check (free pages of the stores included)
        self.disk_free_limit = 0
        self._disk_timer: asyncio.TimerHandle | None = None

    def set(self, key: tuple, active: bool) -> None:
        if active == (key in self.active):
            return
        was_on = bool(self.active)
        (self.active.add if active else self.active.discard)(key)
        if self._logs:
            log.warning("resource alarm %s %s: %s", key[1], "on" if active else "off", key)
        if bool(self.active) != was_on:
            self._on_change(self.reason())

    def clear_source(self, source) -> None:
        """A shard died: the alarms it raised go with it."""
        for key in [k for k in self.active if k[0] == source]:
            self.set(key, False)

    def on(self, resource: str) -> bool:
        return any(r == resource for _, r in self.active)

    def reason(self) -> str:
        resources = sorted({resource for _, resource in self.active})
        return " and ".join(f"low on {r}" for r in resources)

    def watch_disk(self, data_dir: str, limit: int) -> None:
        """Block publishers while free disk is under the limit (RabbitMQ's disk alarm),
        checked every second or sooner (check_interval). LMDB files never shrink:
        what consumers and purges free stays in the shard stores as free pages,
        which they fill before growing, so those count as free too, and the alarm
        clears once the data is gone (a journal a flood grew shrinks back then)."""
        self.disk_free_limit = limit
        try:
            self.disk_free = shutil.disk_usage(data_dir).free + sum(
                reusable_bytes(os.path.join(data_dir, entry))
                for entry in os.listdir(data_dir)
                if entry.startswith("shard-") and entry[6:].isdigit())
        except OSError as error:  # out of descriptors, say: the alarm stays as it was
            log.warning("cannot check free disk space in %s: %s", data_dir, error)
            interval = DISK_CHECK_INTERVAL
        else:
            self.set(("gateway", "disk"), self.disk_free < limit)
            interval = check_interval(self.disk_free, limit)
        self._disk_timer = asyncio.get_running_loop().call_later(
            interval, self.watch_disk, data_dir, limit)

    def stop(self) -> None:
        if self._disk_timer is not None:
            self._disk_timer.cancel()


def check_interval(free: int, limit: int) -> float:
    """Seconds to the next disk check with `free` bytes free (RabbitMQ's rule)."""
    return min(DISK_CHECK_INTERVAL, max(DISK_CHECK_MIN, 2 * (free - limit) / FASTEST_WRITE))
