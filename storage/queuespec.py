"""What a queue is, as declared: the one record of a queue's definition that the
gateway keeps, the ring carries to a shard and both stores write.

It lives in storage/, the lowest layer: shards/ and gateway/ import storage/ and
storage/ imports neither, so every side can share it. Runtime state (the queue's
id, shard, owner connection, policy) is held beside a spec, never copied into it.
It is array_like: the shard store and meta/ write it, so its field order is an
on-disk format (storage/upgrade.py)."""

from __future__ import annotations

import msgspec


class QueueSpec(msgspec.Struct, array_like=True, frozen=True):
    vhost: str
    name: str
    durable: bool
    exclusive: bool  # dies with its connection (RabbitMQ then ignores durable)
    auto_delete: bool
    arguments: dict  # as declared, before any policy

    @property
    def queue_type(self) -> str:
        return self.arguments.get("x-queue-type", "classic")

    @property
    def stored(self) -> bool:
        """Kept across restarts: durable and not exclusive."""
        return self.durable and not self.exclusive
