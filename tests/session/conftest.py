"""Session tests: the whole connection and channel driven in-process."""

from __future__ import annotations

import pytest

from ..support.inproc import InProcessGateway, running_gateway


@pytest.fixture(scope="module")
def inproc_gateway(tmp_path_factory):
    """A Gateway with one shard process in this process's own asyncio loop (tests/support/inproc.py)."""
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
