"""The shard's ends of its gateways' rings: per gateway process a command ring
and an event ring, and how many of its command ring's records the shard has
worked through (Progress: each gateway counts the records it sent, so credit
flow needs a count per ring).

Every command ring rings one data doorbell, so an idle shard sleeps on one fd
whichever gateway has work for it. A gateway whose event ring is full has its
command ring left unread: that is the backpressure it feels, as with a single
gateway. The other gateways go on meanwhile, so a gateway that died with a
full event ring stops nobody, and gateway 0's GatewayLost for it is still read.
"""

from __future__ import annotations

from . import records as r
from .outbox import Outbox
from .ring import Ring


class GatewayRings:
    def __init__(self, pairs: list[r.RingPair]):
        self.commands = [Ring.attach(pair.commands) for pair in pairs]
        self.events = [Ring.attach(pair.events) for pair in pairs]
        self.doorbell = pairs[0].commands.data_fd  # shared by every command ring
        self.done = [0] * len(pairs)  # command records worked through, per ring
        self.blocked: list[int] = []  # gateways whose events wait for ring space

    def write(self, outbox: Outbox) -> None:
        """Write what fits of each gateway's waiting events (one doorbell each at
        most) and note whose still wait."""
        blocked = []
        for gateway, ring in enumerate(self.events):
            if outbox.records[gateway] or ring.backlogged():
                outbox.sent(gateway, ring.write_many(outbox.records[gateway]))
                ring.flush()
                if outbox.records[gateway] or ring.backlogged():
                    blocked.append(gateway)
        self.blocked = blocked

    def all_blocked(self) -> bool:
        return len(self.blocked) == len(self.events)

    def unsent(self, outbox: Outbox) -> bool:
        """Events wait for a gateway whose ring has room (put after the last write)."""
        return any(records for gateway, records in enumerate(outbox.records)
                   if gateway not in self.blocked)

    def space_fds(self) -> list[int] | None:
        """The space doorbells of the blocked gateways' event rings, to wait on;
        None if one has room by now (write again instead)."""
        fds = []
        for gateway in self.blocked:
            ring = self.events[gateway]
            if not ring.want_space():
                return None
            fds.append(ring.spec().space_fd)
        return fds

    def clear_space(self) -> None:
        for gateway in self.blocked:
            self.events[gateway].clear_space_doorbell()

    def read(self) -> list[tuple[int, list]]:
        """(gateway, its command batches) for each gateway with commands, gateway 0
        first: what a gateway wrote before gateway 0 reported it lost is then read
        in the same turn as the report, or earlier."""
        got = []
        blocked = self.blocked
        for gateway, ring in enumerate(self.commands):
            if not blocked or gateway not in blocked:
                batches = ring.read_many(r.decode_commands)
                if batches:
                    got.append((gateway, batches))
        return got

    def is_empty(self) -> bool:
        return all(ring.is_empty() for ring in self.commands)

    def sleep(self) -> bool:
        """Ask every readable command ring for the doorbell; True if all are still
        empty (wait on the doorbell, then woke())."""
        asked = []
        for gateway, ring in enumerate(self.commands):
            if gateway in self.blocked:
                continue
            if not ring.sleep():
                for other in asked:
                    other.awake()
                return False
            asked.append(ring)
        return True

    def woke(self) -> None:
        for ring in self.commands:
            ring.awake()
        self.commands[0].clear_data_doorbell()  # one fd for all

    def reset(self, gateway: int) -> None:
        """The gateway died: its rings are empty and new for the one replacing it."""
        self.commands[gateway].reset()
        self.events[gateway].reset()
        self.done[gateway] = 0
        if gateway in self.blocked:
            self.blocked.remove(gateway)
