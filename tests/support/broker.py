"""Starting a real `warren serve` subprocess on a free port with a temp data dir
(RunningBroker), and waiting for what it does: the end-to-end tests' helpers."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika.exceptions
import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAYS = 1  # of the brokers a test starts, unless it says (tests/e2e/conftest.py sets it)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_line(stream, timeout: float) -> str:
    """One line from a pipe, or '' once the deadline passes."""
    deadline = time.monotonic() + timeout
    data = b""
    fd = stream.fileno()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class PortTaken(RuntimeError):
    """The broker could not bind the management port a test picked for it."""


class RunningBroker:
    def __init__(self, data_dir: Path, shards: int = 2, extra_args: list[str] | None = None,
                 management: bool = False, gateways: int | None = None, preexec_fn=None,
                 host: str = "127.0.0.1", prefix: list[str] | None = None):
        self.data_dir = data_dir
        self.host = host  # where its listeners are (a test's network namespace has its own)
        self.prefix = prefix or []  # before the command: `ip netns exec NAME`, say
        self.preexec_fn = preexec_fn  # run in the broker's process before it starts
        self.gateways = GATEWAYS if gateways is None else gateways
        # The management listener is off unless a test asks for it (on a free port),
        # so that brokers of parallel tests never compete for 15672.
        self.management_port = free_port() if management else 0
        self.shards = shards
        self.extra_args = extra_args or []
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"
        self.process: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 30.0) -> "RunningBroker":
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                # the free port picked for the management listener was taken by
                # another process before the broker bound it
                self.management_port = free_port()
        return self._start(timeout)

    def _start(self, timeout: float) -> "RunningBroker":
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "warren.gateway.cli.main", "serve", "--port", "0",
             "--bind", self.host, "--management-bind", self.host, "--data",
             str(self.data_dir), "--shards", str(self.shards), "--management-port",
             str(self.management_port), "--gateways", str(self.gateways), *self.extra_args],
            stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT, preexec_fn=self.preexec_fn,
            # each gateway announces a port of its own, to pin a client to it
            env={**os.environ, "WARREN_GATEWAY_PORTS": "1" if self.gateways > 1 else ""})
        self._lines = []
        while "listening on amqp://" not in (line := read_line(self.process.stdout, timeout)):
            if not line.startswith("Warren gateway "):
                self.stop()
                log = self.log_text()
                last = log.splitlines()[-1:]
                if self.management_port and last and \
                        f":{self.management_port} (address already in use)" in last[0]:
                    raise PortTaken(log)
                raise RuntimeError(f"broker did not start: {line!r}; log:\n{log}")
            self._lines.append(line)
        self.port = int(line.split("amqp://", 1)[1].split()[0].rsplit(":", 1)[1])
        self._lines.append(line)
        return self

    def gateway_port(self, index: int, timeout: float = 30.0) -> int:
        """The port only gateway `index` listens on (with gateways > 1)."""
        marker = f"Warren gateway {index} on amqp://"
        while True:
            for line in self._lines:
                if line.startswith(marker):
                    return int(line[len(marker):].split()[0].rsplit(":", 1)[1])
            line = read_line(self.process.stdout, timeout)
            if not line:
                raise RuntimeError(f"gateway {index} announced no port")
            self._lines.append(line)

    def forget_gateway_port(self, index: int) -> None:
        """Gateway `index` was restarted: its next announced port is the one."""
        self._lines = [line for line in self._lines
                       if not line.startswith(f"Warren gateway {index} on")]

    def gateway_url(self, index: int) -> str:
        return f"amqp://guest:guest@{self.host}:{self.gateway_port(index)}/%2F"

    def listener_port(self, scheme: str, timeout: float = 10.0) -> int:
        """The port of another listener (amqps, http) from the lines the broker
        printed after the first, read as needed."""
        marker = f"{scheme}://"
        while True:
            for line in self._lines:
                if marker in line:
                    return int(line.split(marker, 1)[1].split()[0].rsplit(":", 1)[1])
            line = read_line(self.process.stdout, timeout)
            if not line:
                raise RuntimeError(f"the broker printed no {scheme} listener")
            self._lines.append(line)

    @property
    def tls_port(self) -> int:
        return self.listener_port("amqps")

    @property
    def http_url(self) -> str:
        """The management API's base URL (once the broker printed it)."""
        return f"http://{self.host}:{self.listener_port('http')}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 20)
        if self.process is not None and self.process.stdout:
            self.process.stdout.close()
        self.log.close()


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str):
    """A tmpfs of `size` (such as "48m") mounted at `path` for the block; the test
    is skipped where mounting is not allowed."""
    path.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {error}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def managed_broker(tmp_path_factory, name: str, shards: int = 1):
    """A module's broker with its management listener (yield from it in a
    fixture); its log must hold no traceback when it stops."""
    broker = RunningBroker(tmp_path_factory.mktemp(name) / "data", shards=shards,
                           management=True).start()
    yield broker
    broker.stop()
    assert "Traceback" not in broker.log_text()


def wait_until(condition, timeout: float = 10.0, interval: float = 0.01, message: str = ""):
    """Poll `condition` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s {message}")
        time.sleep(interval)


def wait_closed(connection, timeout: float = 15.0) -> None:
    """Wait until the broker has closed a pika BlockingConnection."""

    def closed() -> bool:
        try:
            connection.process_data_events(0.05)
        except pika.exceptions.AMQPConnectionError:
            return True
        return not connection.is_open

    wait_until(closed, timeout=timeout)
