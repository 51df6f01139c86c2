"""Telling the event loop that a child process (a shard, a follower gateway) exited.

By the child's pidfd where the kernel has them (Linux 5.3 and later): the loop
watches it like a socket. Where it has not (older kernels, some sandboxes, and
valgrind, which does not know the call), a thread waits for the child and hands
the news to the loop. The thread waits with WNOWAIT, so the child stays
unreaped: its Popen still collects the exit status.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from typing import Callable


class ExitWatch:
    def __init__(self, loop: asyncio.AbstractEventLoop, process: subprocess.Popen,
                 on_exit: Callable[[], None]):
        """Call `on_exit()` in `loop` once `process` has exited, unless cancelled first."""
        self._loop = loop
        self._on_exit = on_exit
        self._cancelled = False
        try:
            self._pidfd: int | None = os.pidfd_open(process.pid)
        except OSError:
            self._pidfd = None
            threading.Thread(target=self._wait, args=(process.pid,), daemon=True,
                             name=f"exitwatch-{process.pid}").start()
        else:
            loop.add_reader(self._pidfd, self._exited)

    @property
    def by_pidfd(self) -> bool:
        return self._pidfd is not None

    def _wait(self, pid: int) -> None:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped meanwhile (Popen.wait after a kill): exited
            pass
        try:
            self._loop.call_soon_threadsafe(self._exited)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _exited(self) -> None:
        if self._cancelled:
            return
        self.cancel()
        self._on_exit()

    def cancel(self) -> None:
        """No call after this (the owner tore down, or reaped the child itself)."""
        self._cancelled = True
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
