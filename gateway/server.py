"""`warren serve`: start the shards, listen for AMQP, stop cleanly on a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys

from . import management
from .broker import Broker
from .config import Config
from .connection import Connection

log = logging.getLogger("warren")


async def serve(settings: Config) -> None:
    loop = asyncio.get_running_loop()
    broker = Broker(os.path.abspath(settings.data_dir), settings.shard_count(),
                    memory_limit=settings.memory_limit_bytes(),
                    disk_free_limit=settings.disk_free_limit,
                    stats_interval=settings.stats_interval,
                    store_map_size=settings.store_map_size, config=settings)
    await broker.start()
    tune = {"channel_max": settings.channel_max, "frame_max": settings.frame_max,
            "heartbeat": settings.heartbeat}
    servers = [await loop.create_server(lambda: Connection(broker, tune), settings.bind,
                                        settings.port, reuse_address=True)]
    host, port = servers[0].sockets[0].getsockname()[:2]
    print(f"Warren listening on amqp://{host}:{port} (data {broker.data_dir}, "
          f"{settings.shard_count()} shards)", flush=True)
    if settings.tls_enabled:
        servers.append(await loop.create_server(
            lambda: Connection(broker, tune), settings.bind, settings.tls_port,
            ssl=tls_context(settings), reuse_address=True))
        tls_host, tls_port = servers[-1].sockets[0].getsockname()[:2]
        print(f"Warren listening on amqps://{tls_host}:{tls_port}", flush=True)
    if settings.management_port:  # 0: no management listener
        listeners = [{"node": management.NODE, "protocol": "amqp", "ip_address": host,
                      "port": port}]
        server, http_port = await management.start(broker, settings.management_bind,
                                                   settings.management_port, listeners)
        servers.append(server)
        print(f"Warren management on http://{settings.management_bind}:{http_port}",
              flush=True)

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()

    log.info("stopping: closing the listeners and %d connections", len(broker.connections))
    for server in servers:
        server.close()
    for conn in list(broker.connections):
        conn.close_for_shutdown()
    await _wait_for(lambda: not broker.connections, timeout=3.0)
    for conn in list(broker.connections):
        conn.transport.abort()
    await broker.stop()
    print("Warren stopped", flush=True)


def tls_context(settings: Config) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_certfile, settings.tls_keyfile)
    if settings.tls_cafile:
        context.load_verify_locations(settings.tls_cafile)
    context.verify_mode = ssl.CERT_REQUIRED if settings.tls_verify_peer else ssl.CERT_NONE
    return context


async def _wait_for(condition, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.02)


def run(settings: Config) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
