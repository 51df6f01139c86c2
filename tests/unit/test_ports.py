"""The session's broker port (session/ports.Broker) is what the Gateway offers:
every attribute and method the Protocol lists is there, methods callable, so a
channel never reaches past the port for something the Gateway lacks."""

from __future__ import annotations

import inspect

from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.session import ports


def members(protocol: type) -> tuple[set[str], set[str]]:
    """(attributes, methods) a Protocol lists, its bases' included."""
    attributes: set[str] = set()
    methods: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False):
            continue
        attributes.update(getattr(cls, "__annotations__", {}))
        methods.update(name for name, value in vars(cls).items()
                       if inspect.isfunction(value) and not name.startswith("_"))
    return attributes, methods


def test_the_gateway_has_every_member_of_the_broker_port(tmp_path):
    gateway = Gateway(Config(data_dir=str(tmp_path), shards=1))
    attributes, methods = members(ports.Broker)
    assert attributes and methods
    assert [name for name in sorted(attributes) if not hasattr(gateway, name)] == []
    assert [name for name in sorted(methods) if not callable(getattr(gateway, name, None))] == []

