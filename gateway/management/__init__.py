"""The management listener: RabbitMQ-compatible HTTP API, Prometheus metrics and a
small dashboard, served from the gateway process."""

from __future__ import annotations

from .api import NODE, Management
from .http import start_server

__all__ = ["NODE", "Management", "start"]


async def start(gateway, host: str, port: int, listeners: list[dict]):
    """The listener, bound; it serves once its start_serving() is awaited."""
    return await start_server(Management(gateway, listeners).handle, host, port)
