"""The committer thread: runs a shard's store commits (LMDB transaction and
fsync, which release the GIL) while the shard's loop goes on applying the next
commands. At most one commit is in flight; its end is signalled on an eventfd
the loop polls, so the loop sleeps in one place for commands and commits alike.
"""

from __future__ import annotations

import os
import queue
import threading


class Committer:
    def __init__(self, run_commit):
        self._run = run_commit
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, name="committer", daemon=True)
        self._thread.start()

    def submit(self, pending) -> None:
        self._done.clear()
        self._jobs.put(pending)

    def finished(self) -> bool:
        """The submitted commit has ended (clears the wake-up signal)."""
        if not self._done.is_set():
            return False
        try:
            os.eventfd_read(self.done_fd)
        except BlockingIOError:
            pass
        return True

    def wait(self) -> None:
        self._done.wait()

    def _work(self) -> None:
        while True:
            pending = self._jobs.get()
            if pending is None:
                return
            try:
                self._run(pending)
            except BaseException:  # a failed commit must still end: nack its confirms
                pending.ok = False
                raise
            finally:
                self._done.set()
                os.eventfd_write(self.done_fd, 1)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(10)
        os.close(self.done_fd)
