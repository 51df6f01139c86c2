"""The clients: /api/connections (read, or closed), /api/channels and
/api/consumers, all from the connections' typed snapshots (gateway/snapshots.py),
this gateway's and the others'."""

from __future__ import annotations

from . import shapes
from .http import Request, Response, not_authorised, not_found
from .listing import listed
from .rights import is_admin, is_monitor


async def connections(management, request: Request, rest: list[str]) -> Response:
    if not rest:
        rates = management.sampler.connection_rates
        return listed(request, [shapes.connection(info, rates(info))
                                for info in management.snapshots(request)])
    conn = _connection_named(management, request, rest[0])
    if request.method == "GET":
        info = conn.snapshot()
        return Response.json(shapes.connection(info,
                                               management.sampler.connection_rates(info)))
    conn.close_forced(request.headers.get("x-reason", "Closed via management plugin"))
    return Response(204)  # DELETE


def _connection_named(management, request: Request, name: str):
    conn = next((c for c in management.connections() if c.name == name), None)
    if conn is None:
        raise not_found()
    # one's own connection, or any to read for monitors and to close for administrators
    if conn.user != request.user.name and not (
            is_admin(request.user) if request.method == "DELETE" else is_monitor(request.user)):
        raise not_authorised("User not authorised to access object")
    return conn


async def connection_channels(management, request: Request, rest: list[str]) -> Response:
    info = _connection_named(management, request, rest[0]).snapshot()
    return listed(request, [shapes.channel(info, ch) for ch in info.channels])


async def vhost_connections(management, request: Request, rest: list[str]) -> Response:
    vhost = management.vhost_named(request, rest[0]).name
    rates = management.sampler.connection_rates
    return listed(request, [shapes.connection(info, rates(info))
                            for info in management.snapshots(request) if info.vhost == vhost])


async def vhost_channels(management, request: Request, rest: list[str]) -> Response:
    vhost = management.vhost_named(request, rest[0]).name
    return listed(request, [shapes.channel(c, ch) for c in management.snapshots(request)
                            if c.vhost == vhost for ch in c.channels])


async def channels(management, request: Request, rest: list[str]) -> Response:
    found = [shapes.channel(c, ch) for c in management.snapshots(request) for ch in c.channels]
    if not rest:
        return listed(request, found)
    found = [ch for ch in found if ch["name"] == rest[0]]
    if not found:
        raise not_found()
    return Response.json(found[0])


async def consumers(management, request: Request, rest: list[str]) -> Response:
    vhost = rest[0] if rest else None
    found = [(c, ch, consumer) for c in management.snapshots(request)
             if vhost is None or c.vhost == vhost
             for ch in c.channels for consumer in ch.consumers]
    offsets = await _stream_offsets(management, [consumer for _, _, consumer in found])
    return listed(request, [shapes.consumer(c, ch, consumer, offsets.get(consumer.holder))
                            for c, ch, consumer in found])


async def _stream_offsets(management, consumers) -> dict[int, int]:
    """The offset each stream consumer reads next, by its id; asked of the shards
    only when a consumer reads a stream."""
    vhosts = management.gateway.catalogue.vhosts
    if not any((meta := vhosts[c.vhost].queues.get(c.queue)) is not None
               and meta.spec.queue_type == "stream"
               for c in consumers if c.vhost in vhosts):
        return {}
    offsets: dict[int, int] = {}
    for figure in (await management.sampler.queue_figures()).values():
        offsets.update(figure.get("stream_offsets", {}))
    return offsets
