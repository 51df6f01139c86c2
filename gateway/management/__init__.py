"""The management listener: RabbitMQ-compatible HTTP API, Prometheus metrics and a
small dashboard, served from the gateway process."""

from __future__ import annotations

from .api import NODE, Management
from .http import start_server

__all__ = ["NODE", "Management", "start"]


async def start(broker, host: str, port: int, listeners: list[dict]):
    """Start the listener; returns (server, bound port)."""
    management = Management(broker, listeners)
    server = await start_server(management.handle, host, port)
    return server, server.sockets[0].getsockname()[1]
