"""How many HTTP connections the management listener holds open: at most so
many in all and from one address, so that clients trickling requests cannot take
the descriptors the AMQP listener needs (issue 56). Pure: the listener asks and
tells it; it answers and counts."""

from __future__ import annotations

# Of the process's descriptor limit, the share HTTP connections may hold at most;
# the rest stay for AMQP clients, the shards' rings and the stores.
HTTP_SHARE = 4


def total_cap(configured: int, descriptor_limit: int) -> int:
    """The cap in all: as configured, and within the descriptor limit's share (a
    negative limit is none)."""
    if descriptor_limit < 0:
        return configured
    return max(1, min(configured, descriptor_limit // HTTP_SHARE))


class Admission:
    def __init__(self, total: int, per_address: int):
        self.total = total
        self.per_address = per_address
        self.open: dict[str, int] = {}  # address -> connections open
        self.count = 0
        self.refused = 0  # since the last time the listener logged them

    def admit(self, address: str) -> str | None:
        """Count a new connection in and return None, or say why it is refused."""
        if self.count >= self.total:
            reason = f"{self.total} management connections are open"
        elif self.open.get(address, 0) >= self.per_address:
            reason = f"{self.per_address} management connections from {address} are open"
        else:
            self.open[address] = self.open.get(address, 0) + 1
            self.count += 1
            return None
        self.refused += 1
        return reason

    def release(self, address: str) -> None:
        """An admitted connection closed."""
        left = self.open[address] - 1
        if left:
            self.open[address] = left
        else:
            del self.open[address]
        self.count -= 1
