"""The brokers the bench measures: any broker at a URL, a private Warren (`warren serve`
on a free port with a temp data dir) or a private RabbitMQ node; each knows the root of
its process tree when it is local, for the broker's CPU and memory figures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import procs
from .fastclient import AMQPError, FastClient, parse_url
from .output import log
from .procs import free_port, listener_pid, read_line, wait_for_port

ROOT = Path(__file__).resolve().parent.parent


class Target:
    """A broker to benchmark: its URL and, when local, the root of its process tree."""

    label = "url"

    def __init__(self, url: str):
        self.url = url
        self._root: int | None = None

    def root_pid(self) -> int | None:
        if self._root is None or not os.path.exists(f"/proc/{self._root}"):
            host, port = parse_url(self.url)[:2]
            if host in ("127.0.0.1", "localhost", "::1"):
                self._root = listener_pid(port)
        return self._root

    def stop(self) -> None:
        pass


class WarrenTarget(Target):
    label = "warren"

    def __init__(self, shards: int | None = None, extra_args: list[str] | None = None):
        self.tmp = tempfile.mkdtemp(prefix="warren-bench-")
        self.shards = shards or os.cpu_count() or 1
        self.log_path = Path(self.tmp) / "broker.log"
        self.log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "warren.gateway.cli.main", "serve", "--port", "0", "--data",
             str(Path(self.tmp) / "data"), "--shards", str(self.shards),
             # No management listener: 15672 may be taken (a RabbitMQ on this machine).
             "--management-port", "0", *(extra_args or [])],
            stdout=subprocess.PIPE, stderr=self.log_file, cwd=ROOT)
        line = read_line(self.process.stdout, 60.0)
        if "listening on amqp://" not in line:
            self.stop()
            raise RuntimeError(f"warren did not start: {line!r}\n"
                               f"{self.log_path.read_text(errors='replace')[-3000:]}")
        port = int(line.split("amqp://", 1)[1].split()[0].rsplit(":", 1)[1])
        super().__init__(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
        self._root = self.process.pid
        log(f"# started {line.strip()} (pid {self.process.pid})")

    def root_pid(self) -> int | None:
        return self.process.pid if self.process.poll() is None else None

    def stop(self) -> None:
        procs.stop(self.process, 30)
        if self.process.stdout:
            self.process.stdout.close()
        self.log_file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


RABBIT_SERVER = Path("/usr/sbin/rabbitmq-server")


def rabbitmq_missing() -> str | None:
    """What to install when RabbitMQ is not there (the bench never installs anything)."""
    if RABBIT_SERVER.exists() and (RABBIT_BIN / "rabbitmq-server").exists():
        return None
    return ("rabbitmq-server is not installed; --compare needs it: "
            "apt-get install rabbitmq-server")


class RabbitTarget(Target):
    """A private RabbitMQ node: free ports, temp dirs, our own process group."""

    label = "rabbitmq"

    def __init__(self, start_timeout: float = 120.0):
        missing = rabbitmq_missing()
        if missing:
            raise RuntimeError(missing)
        self.tmp = tempfile.mkdtemp(prefix="warren-bench-rabbit-")
        self.port = free_port()
        self.nodename = f"warrenbench-{os.getpid()}@localhost"
        tmp = Path(self.tmp)
        (tmp / "rabbitmq.conf").write_text(
            "loopback_users = none\n"
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            # As Warren's default: 40% of RAM, and publishers blocked under 50 MB free disk.
            "vm_memory_high_watermark.relative = 0.4\n"
            "disk_free_limit.absolute = 50MB\n")
        (tmp / "enabled_plugins").write_text("[].\n")
        (tmp / "home").mkdir()
        self.env = dict(
            os.environ,
            HOME=str(tmp / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
            ERL_EPMD_PORT=str(free_port()),
            RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"),
            RABBITMQ_MNESIA_DIR=str(tmp / "mnesia" / self.nodename),
            RABBITMQ_LOG_BASE=str(tmp / "log"),
            RABBITMQ_LOGS=str(tmp / "log" / "rabbit.log"),
            RABBITMQ_PID_FILE=str(tmp / "rabbit.pid"),
        )
        self.env.pop("RABBITMQ_ALLOW_INPUT", None)  # any value, even "false", means a shell
        self.log_file = open(tmp / "stdout.log", "ab")
        self.process = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.env,
                                        cwd=self.tmp, stdout=self.log_file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        super().__init__(f"amqp://guest:guest@127.0.0.1:{self.port}/%2F")
        if not wait_for_port(self.port, start_timeout, lambda: self.process.poll() is None):
            text = (tmp / "stdout.log").read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"rabbitmq did not start within {start_timeout}s:\n{text}")
        # The AMQP listener opens last, but give the node a moment to finish booting.
        self._wait_amqp(30.0)
        version = self._version()
        log(f"# started RabbitMQ {version} node {self.nodename} on port {self.port} "
            f"(pid {self.process.pid}, beam {self.root_pid()})")

    def _wait_amqp(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                FastClient(self.url, timeout=5).close()
                return
            except (OSError, AMQPError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _version(self) -> str:
        try:
            client = FastClient(self.url, timeout=5)
            version = client.server_properties.get("version", b"?")
            client.close()
            return version.decode() if isinstance(version, bytes) else str(version)
        except (OSError, AMQPError, TimeoutError):
            return "?"

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodename, "stop"],
                               env=self.env, timeout=60, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            except (subprocess.TimeoutExpired, OSError):
                pass
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()
        # The node's private epmd (on its own port) outlives the node: stop it too.
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        try:
            subprocess.run([epmd, "-kill"], env=self.env, timeout=10,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.log_file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
