"""The disk watch of the resource alarms (io/alarms.py), in-process: a check that
fails changes nothing and the next decides, and checks come sooner near the limit.
tests/e2e/test_e2e_disk.py has a broker on a full disk."""

from __future__ import annotations

import asyncio
import errno
import shutil

import pytest

from warren.gateway.io import alarms


def test_a_disk_check_that_fails_keeps_the_watch_going(tmp_path, monkeypatch):
    """A check that cannot look (the gateway out of descriptors) changes nothing
    and the next one, a second later, decides: the watch does not end there."""
    real = shutil.disk_usage
    looks = []

    def disk_usage(path):
        looks.append(path)
        if len(looks) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path)

    monkeypatch.setattr(alarms.shutil, "disk_usage", disk_usage)
    changes = []
    watch = alarms.Alarms(changes.append, logs=False)

    async def scenario():
        watch.watch_disk(str(tmp_path), 10**18)  # more than any disk: the alarm goes on
        assert changes == [] and not watch.on("disk")
        deadline = asyncio.get_running_loop().time() + 10
        while not watch.on("disk"):
            assert asyncio.get_running_loop().time() < deadline, "the next check never came"
            await asyncio.sleep(0.05)
        watch.stop()

    asyncio.run(scenario())
    assert changes == ["low on disk"] and len(looks) == 2


def test_the_disk_is_checked_sooner_near_the_limit():
    """RabbitMQ's rule: twice the time a 250 MB/s writer takes to use up the margin,
    between 100 ms and (here) a second."""
    assert alarms.check_interval(10**12, 50_000_000) == 1.0
    assert alarms.check_interval(75_000_000, 50_000_000) == pytest.approx(0.2)
    assert alarms.check_interval(40_000_000, 50_000_000) == 0.1  # under it: the alarm is on
