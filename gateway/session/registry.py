"""Who is here: a gateway process's connections, the holders (channels and
consumers, by their broker-wide id) its shards' events come back to, the
channels behind its direct reply-to addresses, and the owners standing for
other gateways' connections. Ids name this gateway (records.gateway_of), so
shards and other gateways know where to answer."""

from __future__ import annotations

from typing import Any

from warren.shards import records as r

from ..values import RemoteOwner
from . import replyto


class Registry:
    def __init__(self, index: int):
        self.index = index  # this gateway process
        self.connections: set = set()
        self.holders: dict[int, Any] = {}  # holder id -> its channel
        self.reply_channels: dict[str, Any] = {}  # direct reply-to key -> channel
        self.remote_owners: dict[int, RemoteOwner] = {}
        self._next_id = 0

    def new_id(self) -> int:
        """A broker-wide id for a connection, channel or consumer (shard 'holders'):
        it names this gateway (records.gateway_of), so shards know where to answer."""
        self._next_id += 1
        return self._next_id * r.MAX_GATEWAYS + self.index

    def add_holder(self, holder: int, channel) -> None:
        self.holders[holder] = channel

    def forget_holder(self, holder: int) -> None:
        self.holders.pop(holder, None)

    def add_reply_channel(self, key: str, channel) -> None:
        self.reply_channels[key] = channel

    def drop_reply_channel(self, key: str) -> None:
        self.reply_channels.pop(key, None)

    def reply_channel(self, address: str):
        """The channel behind a direct reply-to address, if it still consumes."""
        key = replyto.key_of(address)
        return self.reply_channels.get(key) if key else None

    def owner_of(self, id: int):
        """The connection an exclusive queue's owner id names (0: none)."""
        if not id:
            return None
        # (negative: a connection of another node of the cluster, cluster/sync.py)
        if id > 0 and r.gateway_of(id) == self.index:
            return next((c for c in self.connections if c.id == id), None)
        owner = self.remote_owners.get(id)
        if owner is None:
            owner = self.remote_owners[id] = RemoteOwner(id)
        return owner

    def opened(self) -> list[tuple[str, str, int]]:
        """(user, vhost, channels) of every open connection here."""
        return [(c.user, c.vhost.name, len(c.channels)) for c in self.connections
                if c.vhost is not None and c.is_open]

    def close_vhost(self, vhost) -> None:
        """A vhost is deleted: its connections close (320 CONNECTION_FORCED)."""
        for conn in [c for c in self.connections if c.vhost is vhost]:
            conn.close_forced(f"vhost '{vhost.name}' is deleted")
