"""`warren serve`: start the shards, listen for AMQP, stop cleanly on a signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from .broker import Broker
from .connection import Connection

log = logging.getLogger("warren")


class ServeOptions:
    def __init__(self, bind: str = "127.0.0.1", port: int = 5672, data: str = "./warren-data",
                 shards: int | None = None, memory_limit: int | None = None,
                 disk_free_limit: int = 50_000_000, stats_interval: float = 5.0,
                 store_map_size: int = 32 << 30):
        self.bind = bind
        self.port = port
        self.data = data
        self.shards = shards or os.cpu_count() or 1
        # As RabbitMQ's vm_memory_high_watermark: 40% of the machine's memory.
        self.memory_limit = (memory_limit if memory_limit is not None
                             else int(0.4 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
        self.disk_free_limit = disk_free_limit
        self.stats_interval = stats_interval
        self.store_map_size = store_map_size


async def serve(options: ServeOptions) -> None:
    loop = asyncio.get_running_loop()
    broker = Broker(os.path.abspath(options.data), options.shards,
                    memory_limit=options.memory_limit, disk_free_limit=options.disk_free_limit,
                    stats_interval=options.stats_interval,
                    store_map_size=options.store_map_size)
    await broker.start()
    server = await loop.create_server(lambda: Connection(broker), options.bind, options.port,
                                      reuse_address=True)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"Warren listening on amqp://{host}:{port} (data {broker.data_dir}, "
          f"{options.shards} shards)", flush=True)

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()

    log.info("stopping: closing the listener and %d connections", len(broker.connections))
    server.close()
    for conn in list(broker.connections):
        conn.close_for_shutdown()
    await _wait_for(lambda: not broker.connections, timeout=3.0)
    for conn in list(broker.connections):
        conn.transport.abort()
    await broker.stop()
    print("Warren stopped", flush=True)


async def _wait_for(condition, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.02)


def run(options: ServeOptions) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(options))
    else:
        uvloop.run(serve(options))
