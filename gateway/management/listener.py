"""The management listener, started by the root process: the HTTP server with
its admission caps, serving the API (api.Management), and the sampling behind
its rates (sampling.Sampler)."""

from __future__ import annotations

import asyncio
import logging
import resource

from .admission import Admission, total_cap
from .api import Management
from .http import Guard, start_server

log = logging.getLogger("warren.management")


async def start(gateway, host: str, port: int, listeners: list[dict]):
    """The listener, bound; it serves once its start_serving() is awaited. The
    counters behind the rates are sampled from now on."""
    config = gateway.config
    descriptors = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    total = total_cap(config.management_max_connections, descriptors)
    if total < config.management_max_connections:
        log.warning("management listener: at most %d connections, a quarter of the %d "
                    "file descriptors this process may open (the rest are for AMQP)",
                    total, descriptors)
    guard = Guard(Admission(total, config.management_max_connections_per_address),
                  config.management_request_timeout)
    management = Management(gateway, listeners)
    server = await start_server(management.handle, host, port, guard)
    sampler = management.sampler
    sampler.task = asyncio.get_running_loop().create_task(sampler.keep_sampling())
    return server
