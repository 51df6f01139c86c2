"""End-to-end tests: each module runs once per gateway count of --gateways
(default 1 and 2): whichever gateway process a client lands on, the broker must
behave the same. A module marked run_once runs once (its brokers choose their
gateway processes themselves); a test marked shard_side runs with the first count,
one marked most_gateways with the last (a broker-wide behaviour that spans the
gateway processes: one gateway is its simpler case)."""

from __future__ import annotations

import subprocess

import pytest

from ..support import broker as brokers
from ..support.broker import RunningBroker
from ..support.checker import FAULT_ROWS, HEADER


def pytest_generate_tests(metafunc):
    if "gateway_count" in metafunc.fixturenames and \
            not metafunc.definition.get_closest_marker("run_once"):
        counts = [int(n) for n in metafunc.config.getoption("--gateways").split(",")]
        if metafunc.definition.get_closest_marker("shard_side"):
            counts = counts[:1]
        elif metafunc.definition.get_closest_marker("most_gateways"):
            counts = counts[-1:]
        metafunc.parametrize("gateway_count", counts, indirect=True, scope="module",
                             ids=[f"gateways{n}" for n in counts])


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The fault rounds' table (test_quorum_faults.py), when this process ran them."""
    rows = config.stash.get(FAULT_ROWS, [])
    if rows:
        terminalreporter.write_sep("-", f"{len(rows)} fault rounds")
        for line in [HEADER, *rows]:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def gateway_count(request) -> int:
    """Gateway processes of the brokers this module's tests start. Module-scoped
    broker fixtures take it as an argument, so each count gets its own broker."""
    brokers.GATEWAYS = getattr(request, "param", 1)
    yield brokers.GATEWAYS
    brokers.GATEWAYS = 1


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


@pytest.fixture(scope="session")
def certificate(tmp_path_factory):
    """A self-signed server certificate for localhost and 127.0.0.1, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "server.pem", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key
