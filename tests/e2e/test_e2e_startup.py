"""Startup failures of a real `warren serve`: one line on stderr naming the cause and
the option that fixes it, a non-zero exit code, and nothing left behind (shared
memory, shard processes, a data directory it created). And a clean stop."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from warren.shards import build

from ..support.broker import ROOT, RunningBroker, wait_until

# Root ignores file modes; without the capability to do so it is bound by them too.
AS_UNPRIVILEGED = (["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
                   if os.geteuid() == 0 and shutil.which("setpriv") else [])
needs_file_modes = pytest.mark.skipif(os.geteuid() == 0 and not AS_UNPRIVILEGED,
                                      reason="root ignores file modes and setpriv is missing")


def serve(*args: str, prefix: list[str] = ()) -> tuple[int, int, str]:
    """Run `warren serve` to its end: (pid, exit code, stderr)."""
    process = subprocess.Popen(
        [*prefix, sys.executable, "-m", "warren.gateway.cli.main", "serve", "--shards", "2",
         "--management-port", "0", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return process.pid, process.returncode, stderr


def shared_memory_of(pid: int) -> list[str]:
    """The ring segments process `pid` created (shards/ring.py names them after it)."""
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"warren_{pid}_")]


def processes_using(data_dir) -> list[int]:
    """Processes whose command line names the data directory (shards carry it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(data_dir).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def assert_failed_cleanly(pid: int, code: int, stderr: str, data_dir, *expected: str) -> str:
    line = stderr.strip()
    assert code != 0, stderr
    assert len(line.splitlines()) == 1, stderr
    assert line.startswith("warren: ") and "Traceback" not in stderr, stderr
    for text in expected:
        assert text in line, stderr
    assert not shared_memory_of(pid)
    wait_until(lambda: not processes_using(data_dir), timeout=20,
               message="(a shard process outlived the failed start)")
    return line


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# -- listeners ----------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--port", "--management-port", "--tls-port"])
def test_a_taken_port_is_named_with_its_option(tmp_path, taken_port, certificate, option):
    data = tmp_path / "new" / "data"
    ports = {"--port": "0", "--management-port": "0", "--tls-port": "0", option: str(taken_port)}
    cert, key = certificate
    result = serve("--data", str(data), "--tls-certfile", str(cert), "--tls-keyfile", str(key),
                   *[part for pair in ports.items() for part in pair])
    line = assert_failed_cleanly(*result, data, f"127.0.0.1:{taken_port}",
                                 "address already in use", f"with {option}")
    assert line.endswith(option)
    assert not (tmp_path / "new").exists()  # the data directory and its new parent


# -- data directory -----------------------------------------------------------------


@pytest.mark.shard_side  # the data directory, before any gateway serves
def test_a_file_where_the_data_directory_should_be(tmp_path):
    in_the_way = tmp_path / "file"
    in_the_way.write_text("not a directory")
    for data in (in_the_way, in_the_way / "data"):
        result = serve("--port", "0", "--data", str(data))
        assert_failed_cleanly(*result, data, f"data directory {data} (not a directory)",
                              "--data")
    assert in_the_way.read_text() == "not a directory"


@needs_file_modes
@pytest.mark.shard_side  # the data directory, before any gateway serves
def test_a_read_only_data_directory(tmp_path):
    parent = tmp_path / "read-only"
    (parent / "data").mkdir(parents=True)
    parent.chmod(0o555)
    (parent / "data").chmod(0o555)
    try:
        for data in (parent / "data", parent / "new"):  # existing, and to be created
            result = serve("--port", "0", "--data", str(data), prefix=AS_UNPRIVILEGED)
            assert_failed_cleanly(*result, data, f"data directory {data} (permission denied)",
                                  "--data")
        assert not (parent / "new").exists()
    finally:
        parent.chmod(0o755)
        (parent / "data").chmod(0o755)


@pytest.mark.shard_side  # the data directory, before any gateway serves
def test_a_store_that_cannot_be_opened(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta").write_text("where the metastore's directory should be")
    result = serve("--port", "0", "--data", str(data))
    assert_failed_cleanly(*result, data, f"cannot open the stores in {data}", "--data")


@pytest.mark.shard_side  # the data directory, before any gateway serves
def test_a_data_directory_in_use_by_another_warren(tmp_path):
    data = tmp_path / "data"
    first = RunningBroker(data, shards=1).start()
    try:
        result = serve("--port", "0", "--data", str(data))
        line = result[2].strip()
        assert result[1] != 0 and len(line.splitlines()) == 1, result[2]
        assert line == (f"warren: data directory {data} is in use by another Warren "
                        f"(pid {first.process.pid}); stop it or use --data")
        assert not shared_memory_of(result[0])
        # The first broker still works, and its directory is free once it stopped.
        socket.create_connection(("127.0.0.1", first.port), timeout=5).close()
    finally:
        first.stop()
    assert first.process.returncode == 0
    second = RunningBroker(data, shards=1).start()
    second.stop()
    assert second.process.returncode == 0


# -- TLS files ----------------------------------------------------------------------


@pytest.mark.parametrize("broken,expected", [
    ("cert", "--tls-certfile"),
    ("key", "--tls-keyfile"),
    ("other key", "--tls-keyfile"),
    ("missing cert", "tls_certfile: no such file"),
    ("missing key", "tls_keyfile: no such file"),
])
def test_bad_tls_files_are_named(tmp_path, certificate, broken, expected):
    cert, key = certificate
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not PEM\n")
    other_key = tmp_path / "other.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-out", str(other_key)],
                   check=True, capture_output=True)
    files = {"cert": (garbage, key), "key": (cert, garbage), "other key": (cert, other_key),
             "missing cert": (tmp_path / "none.pem", key),
             "missing key": (cert, tmp_path / "none.key")}[broken]
    data = tmp_path / "data"
    result = serve("--port", "0", "--tls-port", "0", "--data", str(data),
                   "--tls-certfile", str(files[0]), "--tls-keyfile", str(files[1]))
    assert_failed_cleanly(*result, data, expected)
    assert not data.exists()


# -- a clean stop -------------------------------------------------------------------


def test_sigterm_stops_a_healthy_broker_and_leaves_no_shared_memory(tmp_path):
    data = tmp_path / "data"
    broker = RunningBroker(data, shards=2, management=True).start()
    try:
        # two rings per shard and gateway (with several, the root's own pair too)
        pairs = broker.gateways + 1 if broker.gateways > 1 else 1
        assert len(shared_memory_of(broker.process.pid)) == 2 * broker.shards * pairs
        broker.http_url  # every listener is up
        broker.signal(signal.SIGTERM)
        assert broker.wait(30) == 0
    finally:
        broker.stop()
    assert not shared_memory_of(broker.process.pid)
    wait_until(lambda: not processes_using(data), timeout=20)
    assert "leaked shared_memory" not in broker.log_text()
    assert "Traceback" not in broker.log_text()
    # the log says which build served, once the broker started (and only then)
    assert broker.log_text().count(f"running the {build.check()[0]}") == 1


def test_a_start_removes_the_rings_a_killed_broker_left(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = f"/dev/shm/warren_{gone.pid}_0d15ea5e"  # as a gateway killed with -9 leaves it
    with open(left, "wb") as ring:
        ring.write(bytes(4096))
    broker = RunningBroker(tmp_path / "data", shards=1).start()
    try:
        # Any broker's start removes every orphan on the machine: under xdist the other
        # worker's broker may take this one first, so the outcome is what is checked.
        wait_until(lambda: not os.path.exists(left), timeout=10)
    finally:
        broker.stop()
        if os.path.exists(left):
            os.unlink(left)
