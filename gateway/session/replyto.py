"""Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): RPC replies go straight
to the requesting channel's consumer, with no reply queue.

A channel consuming from the pseudo-queue `amq.rabbitmq.reply-to` (no-ack) gets
a random key; its requests carry `amq.rabbitmq.reply-to.<key>` as reply_to, and
a reply published to the default exchange with that routing key is delivered
to the channel at once, or dropped if the channel is gone.
"""

from __future__ import annotations

import secrets

REPLY_QUEUE = "amq.rabbitmq.reply-to"
_PREFIX = REPLY_QUEUE + "."


def is_reply_queue(name: str) -> bool:
    return name == REPLY_QUEUE or name.startswith(_PREFIX)


def new_address(gateway: int = 0, node: int = 0) -> tuple[str, str]:
    """(key, reply-to address) for a channel's reply consumer on gateway process
    `gateway` (of node number `node` in a cluster): the key names them, so a
    reply published on another gateway or node finds it."""
    token = secrets.token_urlsafe(18)  # (base64url: never a '.')
    key = f"{gateway}.{token}" if not node else f"{node}.{gateway}.{token}"
    return key, _PREFIX + key


def key_of(address: str) -> str | None:
    return address[len(_PREFIX):] if address.startswith(_PREFIX) else None


def gateway_of(address: str) -> int | None:
    """The gateway process whose channel a reply-to address names, if any."""
    parts = (key_of(address) or "").split(".")
    number = parts[-2] if len(parts) >= 2 else ""
    return int(number) if number.isdigit() else None


def node_of(address: str) -> int:
    """The cluster node number a reply-to address names (0: this node's, or a node
    alone)."""
    parts = (key_of(address) or "").split(".")
    return int(parts[0]) if len(parts) == 3 and parts[0].isdigit() else 0
