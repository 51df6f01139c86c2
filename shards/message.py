"""The messages a queue holds (shards/queue.py): plain ones, four fields each,
and rich ones for the queues that need more (TTL, priorities, length in bytes,
quorum return counts). Their order in a heap is their order in the queue.
pip install compiles this module as it is (warren.shards._message), the build
the compiled queue makes and compares its messages with."""

from __future__ import annotations

from typing import Any

import msgspec

from warren.gateway.amqp.properties import PropertiesError, peek_expiration, peek_priority

# What a message held in RAM costs beyond its properties and body (its Message,
# content tuple and queue slot), measured with a transient flood: 100-byte
# messages took ~455 bytes each. The memory alarm counts it, so memory_limit
# bounds what a flood of small messages really costs.
CONTENT_OVERHEAD = 350
NO_CONTENT: tuple[Any, Any, Any, Any] = (None, None, None, None)  # read back from storage


class Message(msgspec.Struct, gc=False, eq=False):
    """A message in a queue. `content` is (exchange, routing key, raw properties,
    body). A stored message (persistent, in a durable queue) keeps only its index
    in RAM once committed: its content becomes None and the shard reads it back
    from warren.storage when it delivers it. Four fields, because a backlog of
    millions is mostly these objects; and not tracked by Python's cyclic garbage
    collector (it refers to no containers that could form a cycle), so a backlog
    adds nothing to the collector's passes."""

    seq: int
    content: tuple[Any, Any, Any, Any] | None
    stored: bool = False
    redelivered: bool = False

    def __lt__(self, other: "Message") -> bool:  # heap order = enqueue order
        return self.seq < other.seq


class RichMessage(Message, gc=False, eq=False):
    """A message of a queue that needs more than the four fields: an expiry time
    (monotonic seconds, or None), the body size (for x-max-length-bytes, once the
    body left RAM) and a priority (x-max-priority). Plain queues never pay for
    these fields. Quorum queues count returns: failed ones (x-delivery-count,
    `delivery_count`) and all of them (`acquired`)."""

    expires: float | None = None
    size: int = 0
    priority: int = 0
    delivery_count: int = 0
    acquired: int = 0

    def __lt__(self, other: "Message") -> bool:  # heap order: higher priority, then older
        return (-self.priority, self.seq) < (-getattr(other, "priority", 0), other.seq)



def own_limits(properties: bytes) -> tuple[int, int]:
    """A stored message's own expiration (ms, -1: none) and priority, read back from
    its raw properties at recovery."""
    try:
        expiration = peek_expiration(properties)
        priority = peek_priority(properties) or 0
    except PropertiesError:
        return -1, 0
    return int(expiration) if expiration is not None and expiration.isdigit() else -1, priority
