"""What a shard has to send to the gateway, in order, encoded for the event ring.

Deliveries, replies, alarms and Progress are added as a turn makes them and
leave at once: the shell takes them at the end of the turn, reads back the
stored content they carry, and puts them in. Publisher confirms are never added
as they arise: group commit (groupcommit.py) holds them until the commit that
covers them is durable, and the shell then puts them in. Put events become ring
records of at most EVENTS_PER_RECORD events each, which wait here while the
event ring is full and leave in order.
"""

from __future__ import annotations

from . import records as r

EVENTS_PER_RECORD = 512


class Outbox:
    def __init__(self):
        self._events: list = []  # this turn's, not yet taken
        self.records: list = []  # encoded, waiting for room in the event ring

    def add(self, event) -> None:
        """An event to go out at the end of this turn."""
        self._events.append(event)

    def take(self) -> list:
        """This turn's events, to have their content filled in and be put."""
        events, self._events = self._events, []
        return events

    def put(self, events: list) -> None:
        """Events ready to go: encode them behind what is waiting."""
        self.records += [r.encode_batch(events[i:i + EVENTS_PER_RECORD])
                         for i in range(0, len(events), EVENTS_PER_RECORD)]

    def sent(self, count: int) -> None:
        """The first `count` records are in the ring."""
        del self.records[:count]
