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

from collections import deque

from .codec import decode_commands
from .outbox import Outbox

# Records by name: a compiled module would look each up in `records` at every use.
from .records import Progress, RingPair
from .ring import Ring

# A gateway that has read none of its waiting events for this long is taken to
# be stuck (stopped, or dying), and credit no longer waits for it.
STALLED_AFTER = 0.5


class GatewayRings:
    def __init__(self, pairs: list[RingPair]):
        self.commands = [Ring.attach(pair.commands) for pair in pairs]
        self.events = [Ring.attach(pair.events) for pair in pairs]
        self.doorbell = pairs[0].commands.data_fd  # shared by every command ring
        self.rung = False  # woken by the doorbell, which is not drained yet
        self.done = [0] * len(pairs)  # command records worked through, per ring
        self.blocked: list[int] = []  # gateways whose events wait for ring space
        # Credit held back, per gateway: [records worked through, the event rings'
        # written() when it was made (None until the turn's events are written)].
        self.held: list[deque] = [deque() for _ in pairs]
        self._seen = [0] * len(pairs)  # each event ring's consumed() when last looked
        self._caught_up = [True] * len(pairs)  # it had read everything then
        self._alive_at = [0.0] * len(pairs)  # when it last read, or had nothing to read

    def write(self, outbox: Outbox) -> None:
        """Write what fits of each gateway's waiting events (one doorbell each at
        most) and note whose still wait."""
        if not self.blocked and not any(outbox.records):  # a pass with nothing to write
            return
        blocked = []
        for gateway, ring in enumerate(self.events):
            if outbox.records[gateway] or ring.backlogged():
                outbox.sent(gateway, ring.write_many(outbox.records[gateway]))
                ring.flush()
                if outbox.records[gateway] or ring.backlogged():
                    blocked.append(gateway)
        self.blocked = blocked

    # -- credit (Progress) across gateways -------------------------------------------
    #
    # With one gateway, Progress goes into the event ring behind the turn's
    # deliveries, so credit comes back only once the gateway has taken them in:
    # publishers are paced by the loop that delivers. With several, a publisher's
    # credit and a consumer's deliveries travel on different rings, and a gateway
    # short of CPU falls ever further behind a publisher on another one: the
    # queue between them grows. So once a publish lands in a queue whose
    # consumers are behind (Shard.behind), its gateway's Progress waits until
    # every other gateway has read the events written before it, as if all shared
    # one ring. Below that backlog nothing waits (a wait on every turn would slow
    # every publisher by a round trip), and a stuck gateway (STALLED_AFTER) stops
    # nobody.

    def worked(self, gateway: int, records: int, outbox: Outbox, behind: bool) -> None:
        """`records` more of `gateway`'s command records were worked through this
        turn; `behind`: they fed a queue whose consumers are behind (a backlog)."""
        self.done[gateway] += records
        held = self.held[gateway]
        if not held and (not behind or len(self.events) == 1):
            outbox.origin = gateway
            outbox.add(Progress(self.done[gateway]))
        elif held and held[-1][1] is None:  # a second batch of records in one turn
            held[-1][0] = self.done[gateway]
        else:
            held.append([self.done[gateway], None])

    def holding(self) -> bool:
        return any(self.held)

    def pass_credit(self, outbox: Outbox, now: float) -> None:
        """Put each held Progress whose events every other gateway has read (call
        after write(), which wrote the events of the turn that made it)."""
        heads = [ring.written() for ring in self.events]
        read = self._read_to(heads, now)
        for gateway, held in enumerate(self.held):
            if not held:
                continue
            if held[-1][1] is None:
                held[-1][1] = heads
                if len(held) > 1 and held[-2][1] == heads:  # no new events since
                    done = held.pop()[0]
                    held[-1][0] = done
            passed = None
            while held and self._passes(gateway, held[0][1], read):
                passed = held.popleft()[0]
            if passed is not None:
                outbox.put(gateway, [Progress(passed)])

    def _read_to(self, heads: list[int], now: float) -> list[float]:
        """How far each gateway has read its event ring: infinitely far if it is
        stuck, not at all if events wait for room in it."""
        read: list[float] = []
        for gateway, ring in enumerate(self.events):
            tail = ring.consumed()
            if tail != self._seen[gateway] or self._caught_up[gateway]:
                self._alive_at[gateway] = now
            self._seen[gateway] = tail
            self._caught_up[gateway] = tail == heads[gateway]
            if now - self._alive_at[gateway] >= STALLED_AFTER:
                read.append(float("inf"))
            else:
                read.append(-1 if gateway in self.blocked else tail)
        return read

    @staticmethod
    def _passes(gateway: int, positions: list[int], read: list[float]) -> bool:
        return all(read[other] >= position for other, position in enumerate(positions)
                   if other != gateway)

    def read_waits(self) -> list[int] | None:
        """The space doorbells of the event rings that held credit waits to see
        read, to wait on; None if one has been read by now (pass it instead)."""
        fds: set[int] = set()
        for gateway, held in enumerate(self.held):
            if not held or held[0][1] is None:
                continue
            unread = False
            for other, position in enumerate(held[0][1]):
                if other == gateway or other in self.blocked:
                    continue
                ring = self.events[other]
                if ring.want_read_to(position):
                    fds.add(ring.spec().space_fd)
                    unread = True
            if not unread and not any(other in self.blocked for other in range(len(held[0][1]))
                                      if other != gateway):
                return None
        return sorted(fds)

    def all_blocked(self) -> bool:
        return len(self.blocked) == len(self.events)

    def unsent(self, outbox: Outbox) -> bool:
        """Events wait for a gateway whose ring has room (put after the last write)."""
        for gateway, records in enumerate(outbox.records):
            if records and gateway not in self.blocked:
                return True
        return False

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
        if self.holding():
            for gateway, ring in enumerate(self.events):
                if gateway not in self.blocked:
                    ring.clear_space_doorbell()

    def read(self) -> list[tuple[int, list]]:
        """(gateway, its command batches) for each gateway with commands, gateway 0
        first: what a gateway wrote before gateway 0 reported it lost is then read
        in the same turn as the report, or earlier."""
        got = []
        blocked = self.blocked
        for gateway, ring in enumerate(self.commands):
            if not blocked or gateway not in blocked:
                batches = ring.read_many(decode_commands)
                if batches:
                    got.append((gateway, batches))
        return got

    def is_empty(self) -> bool:
        for ring in self.commands:
            if not ring.is_empty():
                return False
        return True

    def sleep(self) -> bool:
        """Ask every readable command ring for the doorbell; True if all are still
        empty (wait on the doorbell, then woke())."""
        self.drain_doorbell()
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
        """Back from a wait. The doorbell is drained later (drain_doorbell, before
        the next wait), not now: its drain is a system call, and the turn's
        deliveries should not wait behind it."""
        for ring in self.commands:
            ring.awake()
        self.rung = True

    def drain_doorbell(self) -> None:
        """Before a wait: take the last wake's ring of the doorbell (one fd for
        all), or the wait would end at once."""
        if self.rung:
            self.rung = False
            self.commands[0].clear_data_doorbell()

    def reset(self, gateway: int) -> None:
        """The gateway died: its rings are empty and new for the one replacing it."""
        self.commands[gateway].reset()
        self.events[gateway].reset()
        self.done[gateway] = 0
        self.held[gateway].clear()
        for held in self.held:  # its ring starts again from 0, read to the end
            for entry in held:
                if entry[1] is not None:
                    entry[1] = entry[1][:gateway] + [0] + entry[1][gateway + 1:]
        if gateway in self.blocked:
            self.blocked.remove(gateway)
