"""Dead-lettering: the x-death history RabbitMQ writes into a dead-lettered
message's headers, and its rule against dead-letter cycles."""

from __future__ import annotations

import datetime

from ..amqp.properties import BasicProperties


def record_death(props: BasicProperties, queue: str, reason: str, exchange: str,
                 routing_key: str, now: datetime.datetime) -> list[dict]:
    """Add this death to the message's headers; return the x-death list, most
    recent first. A (queue, reason) seen before has its count raised and moves to
    the front; per-message expiration is moved to original-expiration (the copy
    must not expire again for the same reason)."""
    headers = dict(props.headers or {})
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    previous = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason),
                    None)
    if previous is not None:
        deaths.remove(previous)
        death = dict(previous)
        death["count"] = int(death.get("count", 1)) + 1
        death["time"] = now
    else:
        death = {"count": 1, "reason": reason, "queue": queue, "time": now,
                 "exchange": exchange, "routing-keys": [routing_key]}
        if props.expiration is not None:
            death["original-expiration"] = props.expiration
    props.expiration = None
    deaths.insert(0, death)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", exchange)
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = exchange
    props.headers = headers
    return deaths


def is_cycle(queue: str, deaths: list[dict]) -> bool:
    """RabbitMQ's rule: the message already died in `queue`, and no death since
    then (that one included) was a rejection by a consumer. Such a message would
    go round forever without anyone seeing it, so it is dropped for that queue."""
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == queue:
            return True
    return False
