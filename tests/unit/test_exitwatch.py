"""Noticing that a child process exited (io/exitwatch.ExitWatch): by pidfd, and by
a waiting thread where the kernel has no pidfd_open (before Linux 5.3, some
sandboxes, valgrind). tests/e2e/test_e2e_exitwatch.py: a broker without pidfds."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import threading

import pytest

from warren.gateway.io.exitwatch import ExitWatch


@pytest.fixture(params=["pidfd", "thread"])
def way(request, monkeypatch) -> str:
    if request.param == "thread":
        monkeypatch.setattr(os, "pidfd_open", lambda *_: (_ for _ in ()).throw(
            OSError(errno.ENOSYS, "Function not implemented")))
    return request.param


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_exit_is_told_once_and_its_status_stays_for_popen(way):
    async def main() -> tuple[list, int]:
        loop = asyncio.get_running_loop()
        told = []
        process = _child("import sys, time; time.sleep(0.2); sys.exit(3)")
        watch = ExitWatch(loop, process, lambda: told.append(process.poll()))
        assert watch.by_pidfd == (way == "pidfd")
        while not told:
            await asyncio.sleep(0.01)
        for _ in range(3):
            await asyncio.sleep(0)
        return told, process.wait(5)

    told, returncode = asyncio.run(asyncio.wait_for(main(), 20))
    assert told == [3]  # the child was still there to be reaped by its Popen
    assert returncode == 3


def test_a_cancelled_watch_tells_nothing(way):
    async def main() -> list:
        loop = asyncio.get_running_loop()
        told = []
        process = _child("import time; time.sleep(30)")
        watch = ExitWatch(loop, process, lambda: told.append(True))
        watch.cancel()
        process.kill()
        process.wait(5)  # reaped here: the waiting thread finds nothing left to wait for
        await asyncio.sleep(0)
        while any(t.name == f"exitwatch-{process.pid}" for t in threading.enumerate()):
            await asyncio.sleep(0.01)
        for _ in range(3):
            await asyncio.sleep(0)
        return told

    assert asyncio.run(asyncio.wait_for(main(), 20)) == []
