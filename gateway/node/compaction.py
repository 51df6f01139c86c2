"""Load compaction: while the broker is lightly loaded, its processes share one CPU.

Every batch crosses from a gateway to a shard process and back, and each
crossing wakes the other process. Waking a process on another, idle CPU costs
an inter-processor interrupt and the idle CPU's way out of its halt, which on
virtual machines is far dearer than the work: on the 2-vCPU test VM a wake-up
ping-pong between two processes costs 31 µs of CPU a round trip across CPUs and
5 µs on one CPU (README, "Scaling and load compaction"). At moderate rates that was most
of the broker's CPU. So while the broker's processes together use little CPU
they are confined to one CPU, and as soon as they need more they get back every
CPU they were allowed. Erlang does the same with its schedulers (RabbitMQ runs
with `+scl true`, scheduler compaction of load, by default).

`Compaction` is the decision (pure); `Compactor` samples the processes' demand
for CPU from /proc and sets their affinity.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable

log = logging.getLogger("warren")

INTERVAL = 0.1  # seconds between samples of the broker's demand for CPU
PACK_BELOW = 0.5  # cores the broker wanted on average over CALM_SAMPLES: pack it
CALM_SAMPLES = 5  # half a second: a lull in a busy load packs it for one interval at most
SPREAD_ABOVE = 0.75  # cores the packed broker wanted in one sample: spread it at once


class Compaction:
    """Whether the broker's processes should be packed onto one CPU, from the
    cores they wanted (ran or waited to run) in each interval. Packing needs a
    calm spell, spreading one busy interval, so a rising load is never held to one
    CPU for long; the gap between the thresholds keeps a steady load from flapping
    (packed, the same load costs less CPU than spread)."""

    def __init__(self):
        self.packed = False
        self._recent: deque[float] = deque(maxlen=CALM_SAMPLES)

    def sample(self, cores: float) -> bool | None:
        """The cores wanted since the last sample -> True: pack now, False: spread
        now, None: stay as they are."""
        if self.packed:
            if cores > SPREAD_ABOVE:
                self.packed = False
                self._recent.clear()
                return False
            return None
        self._recent.append(cores)
        if len(self._recent) == CALM_SAMPLES and sum(self._recent) < PACK_BELOW * CALM_SAMPLES:
            self.packed = True
            return True
        return None


class Compactor:
    """Samples the broker's processes (`pids()`: this one, the shards, the other
    gateways) every INTERVAL and sets the affinity of every thread of theirs: one
    CPU while packed, the CPUs this process was allowed at start otherwise.

    What is sampled is demand: the time each process's main thread ran plus the
    time it waited, runnable, for a CPU (/proc/PID/schedstat). Waiting counts
    because a CPU shared with something busy shows up there first: the broker
    spreads when its one CPU is crowded, whoever crowds it. Each process is set
    when first seen and again whenever the decision changes."""

    def __init__(self, pids: Callable[[], Iterable[int]]):
        self._pids = pids
        self._allowed = frozenset(os.sched_getaffinity(0))
        self._compaction = Compaction()
        self._seen: dict[int, int] = {}  # pid -> ns run and waited, at the last sample
        self._placed: dict[int, frozenset[int] | None] = {}  # pid -> the CPUs set for it
        self._cpu = min(self._allowed)
        self._clock = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def packed(self) -> bool:
        return self._compaction.packed

    def start(self) -> bool:
        """Begins sampling; False (and nothing done) with only one CPU, or where the
        kernel keeps no scheduler statistics."""
        if len(self._allowed) < 2 or not _schedstat_kept():
            return False
        self._loop = asyncio.get_running_loop()
        self._clock = self._loop.time()
        self._timer = self._loop.call_later(INTERVAL, self._sample)  # sets the baselines
        return True

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sample(self) -> None:
        self._timer = self._loop.call_later(INTERVAL, self._sample)
        try:
            self._place(self._decide())
        except PermissionError as error:  # a sandbox that forbids it: the OS places them
            log.warning("load compaction off: cannot set CPU affinity (%s)", error.strerror)
            self.stop()
        except OSError as error:  # out of descriptors, say: the next sample tries again
            log.debug("load compaction skipped a sample: %s", error)

    def _decide(self) -> list[int]:
        """The pids of now, after a sample of their demand."""
        now = self._loop.time()
        elapsed, self._clock = now - self._clock, now
        pids = list(self._pids())
        spent = 0
        seen = {}
        for pid in pids:
            ns = _demand_ns(pid)
            if ns is None:  # gone (a shard being restarted)
                continue
            seen[pid] = ns
            spent += ns - self._seen.get(pid, ns)
        self._seen = seen
        demand = spent / 1e9 / elapsed if elapsed > 0 else 0.0
        decision = self._compaction.sample(demand)
        if decision is True:
            self._cpu = _current_cpu(self._allowed)
            log.debug("load compaction: demand %.2f cores, the broker's processes move to"
                      " CPU %d", demand, self._cpu)
        elif decision is False:
            log.debug("load compaction: demand %.2f cores, the broker's processes spread"
                      " over CPUs %s", demand, sorted(self._allowed))
        return pids

    def _place(self, pids: list[int]) -> None:
        """Sets every thread of each process that is not where it belongs now; one
        that fails is tried again at the next sample."""
        cpus = frozenset({self._cpu} if self.packed else self._allowed)
        self._placed = {pid: self._placed.get(pid) for pid in pids}
        for pid, placed in self._placed.items():
            if placed == cpus:
                continue
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:  # gone
                continue
            for tid in threads:
                try:
                    os.sched_setaffinity(int(tid), cpus)
                except ProcessLookupError:  # the thread (or process) just ended
                    pass
            self._placed[pid] = cpus


def _demand_ns(pid: int) -> int | None:
    """Nanoseconds the process's main thread has run plus waited to run, or None
    if the process is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            run, wait, _ = f.read().split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(run) + int(wait)


def _schedstat_kept() -> bool:
    """Whether the kernel keeps run and wait times (CONFIG_SCHED_INFO): without, it
    shows zeros, even for this process, which has run."""
    try:
        return _demand_ns(os.getpid()) != 0
    except OSError:  # cannot tell now (out of descriptors, say): the samples will try
        return True


def _current_cpu(allowed: frozenset[int]) -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat), so the one
    CPU is where the gateway already is."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    cpu = int(stat[stat.rindex(b")") + 2:].split()[36])
    return cpu if cpu in allowed else min(allowed)
