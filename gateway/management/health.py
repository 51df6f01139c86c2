"""RabbitMQ's health checks (/api/health/checks/..., /api/healthchecks/node,
/api/aliveness-test) of alarms, shards, listeners and certificates, with its 200,
400 and 503 bodies, for Kubernetes probes and load balancers."""

from __future__ import annotations

import logging
import ssl
import time

from ..broker.exchange import QUEUE
from . import shapes
from .http import Request, Response, bad_request

log = logging.getLogger("warren.management")

# RabbitMQ's names for a protocol, to the one its listeners carry
PROTOCOL_ALIASES = {"amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp",
                    "amqp0_9_1": "amqp", "amqps": "amqp/ssl", "amqp091/ssl": "amqp/ssl"}
UNIT_SECONDS = {"days": 86400, "weeks": 7 * 86400, "months": 30 * 86400,
                "years": 365 * 86400}


async def healthchecks(management, request: Request, rest: list[str]) -> Response:
    return _alarms(management.gateway)


async def health(management, request: Request, rest: list[str]) -> Response:
    """RabbitMQ's /api/health/checks/..., its bodies, 200 or 503. alarms and
    local-alarms (one node: the same) here also fail while a shard keeps dying."""
    check, args = rest[1], rest[2:]
    if check in ("alarms", "local-alarms"):
        return _alarms(management.gateway)
    if check == "virtual-hosts":  # a vhost is never down on its own here
        return Response.json({"status": "ok"})
    if check in ("node-is-quorum-critical", "node-is-mirror-sync-critical"):
        return Response.json({"status": "ok", "reason": "single node cluster"})
    if check == "port-listener":
        return port_listener(management.listeners, args[0])
    if check == "protocol-listener":
        return protocol_listener(management.listeners, args[0])
    return certificate_expiration(management.listeners, management.gateway.config.tls_certfile,
                                  *args, time.time())


async def aliveness_test(management, request: Request, rest: list[str]) -> Response:
    if rest:  # RabbitMQ's test declares a queue there: it needs the permission
        management.check_permission(request, management.vhost_named(request, rest[0]),
                                    "configure", QUEUE, "aliveness-test")
    return Response.json({"status": "ok"})


def _alarms(gateway) -> Response:
    alarms = [{"node": shapes.NODE, "resource": resource}
              for resource in sorted({resource for _, resource in gateway.alarms.active})]
    shards = failing_shards(gateway)
    if not alarms and not shards:
        return Response.json({"status": "ok"})
    reasons = (["resource alarm(s) in effect in the cluster"] if alarms else []) + [
        f"shard {s['shard']} keeps failing ({s['restarts']} restarts, last exit code "
        f"{s['exit_code']})" for s in shards]
    return Response.json({"status": "failed", "reason": "; ".join(reasons),
                          "alarms": alarms, "failing_shards": shards}, status=503)


def failing_shards(gateway) -> list[dict]:
    return [{"shard": index, **failure}
            for index, failure in sorted(gateway.shards.failing.items())]


def _failed(reason: str, **fields) -> Response:
    return Response.json({"status": "failed", "reason": reason, **fields}, status=503)


def port_listener(listeners: list[dict], port: str) -> Response:
    if not port.isdigit():
        raise bad_request("Invalid port")
    if int(port) in {listener["port"] for listener in listeners}:
        return Response.json({"status": "ok", "port": int(port)})
    return _failed("No active listener", missing=int(port),
                   ports=sorted({listener["port"] for listener in listeners}))


def protocol_listener(listeners: list[dict], protocol: str) -> Response:
    wanted = PROTOCOL_ALIASES.get(protocol.lower(), protocol.lower())
    protocols = sorted({listener["protocol"] for listener in listeners})
    if wanted in protocols:
        return Response.json({"status": "ok", "protocol": wanted})
    return _failed("No active listener", missing=wanted, protocols=protocols)


def certificate_expiration(listeners: list[dict], certfile: str, within: str, unit: str,
                           now: float) -> Response:
    """503 when the AMQPS listener's certificate expires within `within` `unit`s."""
    if unit not in UNIT_SECONDS:
        raise bad_request("Time unit not recognised. Supported units: days, weeks, "
                          "months, years.")
    if not within.isdigit():
        raise bad_request("Invalid expiration value.")
    expires = _expiry(certfile) if certfile else None
    if expires is None or expires > now + int(within) * UNIT_SECONDS[unit]:
        return Response.json({"status": "ok"})
    return _failed("Certificates expiring",
                   expired=[dict(listener, certfile=certfile) for listener in listeners
                            if listener["protocol"] == "amqp/ssl"])


def _expiry(certfile: str) -> float | None:
    """When the first certificate in `certfile` expires (seconds since the epoch)."""
    try:
        # the ssl module's own decoder (the one its tests use): no extra dependency
        decoded = ssl._ssl._test_decode_cert(certfile)  # noqa: SLF001
        return ssl.cert_time_to_seconds(decoded["notAfter"])
    except (OSError, ssl.SSLError, KeyError, ValueError, AttributeError):
        log.warning("cannot read the expiry of the certificate %s", certfile)
        return None
