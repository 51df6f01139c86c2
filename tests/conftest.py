"""Shared fixtures: a real `warren serve` subprocess on a free port and a temp data dir."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pika.exceptions
import pytest

from warren.loadtest import procs
from warren.loadtest.procs import free_port, read_line

from .inproc import InProcessGateway, running_gateway

ROOT = Path(__file__).resolve().parent.parent
GATEWAYS = 1  # of the brokers a test starts, unless it says (the gateway_count fixture)
# The end-to-end modules run with each gateway count of --gateways (default 1 and 2):
# whichever gateway process a client lands on, the broker must behave the same.
END_TO_END = re.compile(r"test_(e2e_(?!gateways)\w+|management_\w+|ctl|chaos_kill|metrics|"
                        r"dashboard)$")


def pytest_addoption(parser):
    parser.addoption("--gateways", default="1,2",
                     help="gateway processes of the brokers the end-to-end tests start; "
                          "with several counts (1,2) each of those tests runs with each")


def pytest_generate_tests(metafunc):
    if "gateway_count" in metafunc.fixturenames and \
            END_TO_END.search(metafunc.module.__name__):
        counts = [int(n) for n in metafunc.config.getoption("--gateways").split(",")]
        if metafunc.definition.get_closest_marker("shard_side"):
            counts = counts[:1]
        metafunc.parametrize("gateway_count", counts, indirect=True, scope="module",
                             ids=[f"gateways{n}" for n in counts])


@pytest.fixture(scope="module", autouse=True)
def gateway_count(request) -> int:
    """Gateway processes of the brokers this module's tests start. Module-scoped
    broker fixtures take it as an argument, so each count gets its own broker."""
    global GATEWAYS
    GATEWAYS = getattr(request, "param", 1)
    yield GATEWAYS
    GATEWAYS = 1


class PortTaken(RuntimeError):
    """The broker could not bind the management port a test picked for it."""


class RunningBroker:
    def __init__(self, data_dir: Path, shards: int = 2, extra_args: list[str] | None = None,
                 management: bool = False, gateways: int | None = None, preexec_fn=None):
        self.data_dir = data_dir
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
            [sys.executable, "-m", "warren.gateway.cli.main", "serve", "--port", "0", "--data",
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
        return f"amqp://guest:guest@127.0.0.1:{self.gateway_port(index)}/%2F"

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
        return f"http://127.0.0.1:{self.listener_port('http')}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 20.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None:
            procs.stop(self.process, 20)
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


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gateway_count):
    running = RunningBroker(tmp_path_factory.mktemp("warren") / "data", shards=4).start()
    yield running
    running.stop()


@pytest.fixture
def fresh_broker(tmp_path):
    running = RunningBroker(tmp_path / "data", shards=2)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def inproc_gateway(tmp_path_factory):
    """A Gateway with one shard process in this process's own asyncio loop (tests/inproc.py)."""
    with running_gateway(tmp_path_factory.mktemp("inproc") / "data") as server:
        yield server


@pytest.fixture
def inproc(inproc_gateway, request) -> InProcessGateway:
    """The module's in-process broker for one test: `inproc.client()` connects; the
    clients are hung up afterwards, and the broker must have logged no error."""
    inproc_gateway.begin_test(request.node.name)
    yield inproc_gateway
    errors = inproc_gateway.end_test()
    assert not errors, "\n".join(errors)


@pytest.fixture(scope="session")
def certificate(tmp_path_factory):
    """A self-signed server certificate for localhost and 127.0.0.1, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "server.pem", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key
