"""A real etcd for the tests: one member on two free loopback ports (client and
peer) with a temporary data directory, which a test can stop, kill, pause and
start again on the same ports and data. The binary is Debian's etcd-server:
installed (/usr/bin/etcd), or else unpacked from its package (tests/support/debian.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import pytest

from .broker import free_port
from .debian import unpacked

INSTALLED = "/usr/bin/etcd"


def binary() -> str | None:
    """etcd's path, or None where it is neither installed nor downloadable."""
    if os.access(INSTALLED, os.X_OK):
        return INSTALLED
    return unpacked("etcd-server", INSTALLED)


class EtcdServer:
    """One etcd member: `start()` runs it and waits until it is healthy."""

    def __init__(self, executable: str, folder: str | None = None, extra: Sequence[str] = (),
                 also: str = ""):
        self.executable = executable
        self.extra = list(extra)  # more flags, such as a shorter progress notification interval
        self._owned = folder is None
        # Its own folder in RAM where there is one: a busy test machine's disk made
        # etcd's fsyncs slow enough to let leases lapse.
        self.folder = folder or tempfile.mkdtemp(
            prefix="warren-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.makedirs(self.folder, exist_ok=True)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        # `also`: one more address to serve clients on (a test's network namespace's)
        self.also = f"http://{also}:{self.client_port}" if also else ""
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [self.executable, "--name", "warren-test",
                "--data-dir", os.path.join(self.folder, "data"),
                "--listen-client-urls", ",".join(filter(None, (self.endpoint, self.also))),
                "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"warren-test={peer}",
                "--logger", "zap", "--log-level", "warn",
                "--log-outputs", os.path.join(self.folder, "etcd.log"), *self.extra]

    def start(self, timeout: float = 20.0) -> EtcdServer:
        assert self.process is None or self.process.poll() is not None, "etcd runs already"
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"etcd not healthy within {timeout}s: {self.log()}")
            time.sleep(0.05)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as answer:
                return b'"true"' in answer.read()
        except (OSError, urllib.error.URLError):
            return False

    def call(self, path: str, request: dict) -> dict:
        """One call of etcd's JSON gateway, blocking: for what a test does behind
        the client's back (compaction, writes while the client's loop is held)."""
        body = json.dumps(request).encode()
        post = urllib.request.Request(self.endpoint + path, data=body, method="POST",
                                      headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=10) as answer:
            return json.loads(answer.read())

    def log(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.folder, "etcd.log")) as f:
            return f.read()[-2000:]
        return ""

    def _signal(self, signum: int) -> None:
        assert self.process is not None and self.process.poll() is None, "etcd is not running"
        self.process.send_signal(signum)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, and waits for it to exit (SIGKILL past `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)  # a paused etcd could not take its SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def cleanup(self) -> None:
        """Stops it and removes its temporary folder."""
        self.stop()
        if self._owned:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.cleanup()


def etcd_or_skip(folder: str | None = None, extra: Sequence[str] = (),
                 also: str = "") -> EtcdServer:
    """An EtcdServer, not started; the test is skipped, saying why, without etcd."""
    found = binary()
    if found is None:
        pytest.skip("no etcd: /usr/bin/etcd is missing and apt could not download "
                    "Debian's etcd-server package")
    return EtcdServer(found, folder, extra, also)


@pytest.fixture(name="etcd_server")
def etcd_server_fixture(tmp_path):
    """A running etcd for one test (import this to use `etcd_server`)."""
    server = etcd_or_skip(str(tmp_path / "etcd"))
    with server:
        yield server
