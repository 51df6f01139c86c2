"""Load compaction's shell on real processes' CPU time and affinity, and a real
broker packing itself when idle (tests/unit/test_compaction.py: the decision)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time

import pytest

from warren.gateway.node import compaction
from warren.gateway.node.compaction import CALM_SAMPLES, Compactor

from ..support.broker import RunningBroker, wait_until
from .test_e2e_basic import shard_pids

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes

ALLOWED = os.sched_getaffinity(0)
several_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs or more")


def affinities(pid: int) -> set[frozenset]:
    """The CPU sets of every thread of the process."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return found


def one_cpu(pids: list[int]) -> int | None:
    """The one CPU all threads of all `pids` are confined to, else None."""
    sets = set().union(*(affinities(pid) for pid in pids))
    if len(sets) == 1 and len(next(iter(sets))) == 1:
        return next(iter(next(iter(sets))))
    return None


SPINNER = """
import sys, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read(1)
while True:
    pass
"""


@several_cpus
def test_idle_processes_share_one_cpu_and_spread_again_once_busy():
    children = [subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for child in children:
            assert child.stdout.readline() == b"ready\n"  # its second thread runs
        watched = children[:2]
        compactor = Compactor(lambda: [child.pid for child in watched])

        async def scenario():
            assert compactor.start()
            pids = [child.pid for child in watched]
            await until(lambda: one_cpu(pids) is not None, "the idle processes share a CPU")
            cpu = one_cpu(pids)
            assert compactor.packed
            watched.append(children[2])  # one more process, as a restarted shard
            await until(lambda: one_cpu([child.pid for child in watched]) == cpu,
                        "a process that appears while packed joins the CPU")
            for child in watched[:2]:  # two of them spin: all of the one CPU
                child.stdin.write(b"x")
                child.stdin.flush()
            await until(lambda: all(affinities(child.pid) == {frozenset(ALLOWED)}
                                    for child in watched),
                        "busy processes get every CPU back")
            assert not compactor.packed
            compactor.stop()

        asyncio.run(scenario())
    finally:
        for child in children:
            child.kill()
            child.wait()


@several_cpus
def test_a_sample_that_fails_is_skipped_and_sampling_goes_on():
    """Out of descriptors (a root at its RLIMIT_NOFILE), /proc cannot be read: that
    sample is skipped, the next ones decide."""
    child = subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    calls = []

    def pids():
        calls.append(None)
        if len(calls) <= 3:  # the first three samples
            raise OSError(errno.EMFILE, "Too many open files")
        return [child.pid]

    try:
        assert child.stdout.readline() == b"ready\n"
        compactor = Compactor(pids)

        async def scenario():
            assert compactor.start()
            await until(lambda: one_cpu([child.pid]) is not None, "packed after the failures")
            assert len(calls) >= 3 + CALM_SAMPLES  # the failed samples counted for nothing
            compactor.stop()

        asyncio.run(scenario())
    finally:
        child.kill()
        child.wait()


@several_cpus
def test_starting_out_of_descriptors_starts_and_leaves_the_reading_to_the_samples(monkeypatch):
    """The root may be at its RLIMIT_NOFILE when compaction starts: starting reads
    nothing it needs, so it neither fails nor stops the broker."""
    tries = []

    def cannot_open(pid):
        tries.append(pid)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(compaction, "_demand_ns", cannot_open)

    async def scenario():
        compactor = Compactor(lambda: [os.getpid()])
        assert compactor.start()
        await until(lambda: len(tries) > CALM_SAMPLES, "samples that fail, skipped")
        assert not compactor.packed
        compactor.stop()

    asyncio.run(scenario())


async def until(condition, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


@several_cpus
def test_an_idle_broker_runs_on_one_cpu(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=2, gateways=2).start()
    try:
        def broker_pids():
            followers = [pid for pid in children_of(broker.process.pid)
                         if pid not in shard_pids(broker)]
            return [broker.process.pid, *shard_pids(broker), *followers]

        assert len(broker_pids()) == 5  # the root, two gateways, two shards
        wait_until(lambda: one_cpu(broker_pids()) is not None, timeout=15,
                   message="the idle broker's processes share one CPU")
    finally:
        broker.stop()


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    ours = b"warren" in f.read()
            except OSError:
                continue
            if ppid == parent and ours:
                found.append(int(entry))
    return found
