"""The management listener: RabbitMQ-compatible HTTP API, Prometheus metrics and a
small dashboard, served from the gateway process."""

from __future__ import annotations

import asyncio

from .api import Management
from .http import start_server
from .shapes import NODE

__all__ = ["NODE", "Management", "start"]


async def start(gateway, host: str, port: int, listeners: list[dict]):
    """The listener, bound; it serves once its start_serving() is awaited. The
    counters behind the rates are sampled from now on."""
    management = Management(gateway, listeners)
    server = await start_server(management.handle, host, port)
    management.sampler = asyncio.get_running_loop().create_task(management.keep_sampling())
    return server
