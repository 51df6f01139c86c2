"""How the root starts its child processes (the shards and the other gateways).

A terminal's Ctrl-C, systemd's stop and `kill -TERM -PGID` signal every process
of the broker at once. A child that died of that signal would be taken for a
failure and restarted by a root that has not yet seen its own copy; so children
are born with the stop signals blocked (a signal mask survives fork and exec,
where a handler does not) and ignore them from their first line: the root alone
decides when, and in which order, they stop.

What a child is started with goes through its stdin, a pipe: a command line is
readable by every local user (`ps`), and a gateway's holds the configuration,
passwords included.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stop_signals_held():
    """Block the stop signals in this thread for the block: the children it starts
    meanwhile inherit them blocked; one that arrives is handled after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def spawn(module: str, spec: bytes, pass_fds: list[int], *label: str) -> subprocess.Popen:
    """Start `python -m module *label`, handing it `spec` on its stdin (see
    read_spec). The label is all the command line shows: a shard's index, which
    tells shards apart in ps."""
    with stop_signals_held():
        process = subprocess.Popen([sys.executable, "-m", module, *label],
                                   stdin=subprocess.PIPE, pass_fds=pass_fds)
    try:
        # A spec is a few KiB, within a pipe's buffer: this does not wait for the
        # child (a larger one would, until the child reads it as it starts).
        process.stdin.write(spec)
        process.stdin.close()
    except OSError:  # it died at once: it is not left running without its spec
        process.kill()
        process.wait()
        raise
    return process


def read_spec() -> bytes:
    """In the child, first: ignore the stop signals (one held since its birth is
    dropped), then read what it was started with."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return sys.stdin.buffer.read()
