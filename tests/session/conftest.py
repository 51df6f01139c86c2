"""Session tests: the whole connection and channel driven in-process, with no
process, no socket and no event loop (tests/support/session.py)."""

from __future__ import annotations

import pytest

from ..support.session import InlineBroker, inline_broker


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """The module's broker: one Gateway and its shard core, in this thread."""
    with inline_broker(tmp_path_factory.mktemp("session") / "data") as broker:
        yield broker


@pytest.fixture
def inline(module_broker, request) -> InlineBroker:
    """The module's broker for one test: `inline.client()` connects; the clients
    are hung up afterwards, and the broker must have logged no error."""
    module_broker.begin_test(request.node.name)
    yield module_broker
    errors = module_broker.end_test()
    assert not errors, "\n".join(errors)
