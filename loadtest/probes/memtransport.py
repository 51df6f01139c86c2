"""An asyncio transport in memory, for driving a gateway Connection without a
socket (bodycost.py)."""

from __future__ import annotations

import asyncio


class MemoryTransport(asyncio.Transport):
    """What Connection uses of an asyncio transport besides writing and closing
    (left to subclasses): its addresses, and reading paused and resumed."""

    def __init__(self, peer: tuple = ("127.0.0.1", 40000)):
        super().__init__({"peername": peer, "sockname": ("127.0.0.1", 5999)})
        self.peer = peer
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused
