"""What a shard has to send to its gateways, in order, encoded for the event rings.

Deliveries, replies, alarms and Progress are added as a turn makes them and
leave at once: the shell takes them at the end of the turn, reads back the
stored content they carry, and puts them in. Publisher confirms are never added
as they arise: group commit (groupcommit.py) holds them until the commit that
covers them is durable, and the shell then puts them in. Put events become ring
records of at most EVENTS_PER_RECORD events each, which wait here while the
event ring is full and leave in order.

With several gateway processes each event goes to the one it concerns: a
delivery or a consumer's end to the gateway of its holder, a confirm to the
gateway of its channel, a reply (and Progress) back to the gateway whose ring
the command came in on (`origin`), an alarm, a queue's deletion or the cost of
publishing into it to all, a dead-lettered message to gateway 0, which
republishes it.
"""

from __future__ import annotations

from .codec import encode_batch

# Records by name: a compiled module would look each up in `records` at every use.
from .records import (
    Alarm,
    Confirmed,
    ConsumerCancelled,
    ConsumerTimedOut,
    Deliver,
    GetReply,
    Progress,
    PublishCost,
    QueueDeleted,
    QueueInfoReply,
    Rejected,
    Reply,
    gateway_of,
)

EVENTS_PER_RECORD = 512

_TO_HOLDER = frozenset((Deliver, ConsumerCancelled, ConsumerTimedOut))
_TO_ORIGIN = frozenset((Reply, GetReply, QueueInfoReply, Progress))
_TO_ALL = frozenset((Alarm, QueueDeleted, PublishCost))
_CONFIRMS = frozenset((Confirmed, Rejected))


class Outbox:
    def __init__(self, gateways: int = 1):
        self.gateways = gateways
        self.origin = 0  # the gateway whose command the shard is handling
        self._turn: list[list] = []  # this turn's events per gateway, not yet taken
        self.records: list[list] = [[] for _ in range(gateways)]  # encoded, per gateway
        self.take()

    def add(self, event) -> None:
        """An event to go out at the end of this turn (set per turn by take())."""

    def add_to(self, gateway: int, event) -> None:
        """An event for one gateway, whatever it concerns."""
        self._turn[gateway].append(event)

    def take(self) -> list[list]:
        """This turn's events per gateway, to have their content filled in and be put."""
        turn = self._turn  # (no comprehension with one gateway: one frame less a turn)
        self._turn = [[] for _ in range(self.gateways)] if self.gateways > 1 else [[]]
        # One gateway has every event: add is its list's append, nothing to route.
        self.add = self._turn[0].append if self.gateways == 1 else self._route_one
        return turn

    def route(self, events: list) -> list[list]:
        """Events per gateway (confirms are split by their channels' gateways)."""
        if self.gateways == 1:
            return [events]
        turn = [[] for _ in range(self.gateways)]
        for event in events:
            self._route(event, turn)
        return turn

    def _route_one(self, event) -> None:
        self._route(event, self._turn)

    def _route(self, event, turn: list[list]) -> None:
        kind = type(event)
        if kind in _TO_HOLDER:
            gateway = gateway_of(event.holder)
            if gateway < self.gateways:
                turn[gateway].append(event)
        elif kind in _TO_ORIGIN:
            turn[self.origin].append(event)
        elif kind in _CONFIRMS:
            split: dict[int, tuple[list, list]] = {}
            for channel, seq in zip(event.channels, event.seqs):
                channels, seqs = split.setdefault(gateway_of(channel), ([], []))
                channels.append(channel)
                seqs.append(seq)
            for gateway, (channels, seqs) in split.items():
                if gateway < self.gateways:
                    turn[gateway].append(kind(channels, seqs))
        elif kind in _TO_ALL:
            for events in turn:
                events.append(event)
        else:  # DeadLettered: gateway 0 republishes
            turn[0].append(event)

    def put(self, gateway: int, events: list) -> None:
        """Events ready to go to `gateway`: encode them behind what is waiting."""
        if len(events) <= EVENTS_PER_RECORD:  # a turn's events at a steady rate: no slicing
            if events:
                self.records[gateway].append(encode_batch(events))
            return
        self.records[gateway] += [encode_batch(events[i:i + EVENTS_PER_RECORD])
                                  for i in range(0, len(events), EVENTS_PER_RECORD)]

    def put_each(self, turn: list[list]) -> None:
        """Each gateway's events (as take() or route() returns them) ready to go."""
        for gateway, events in enumerate(turn):
            if events:
                if len(events) <= EVENTS_PER_RECORD:  # put()'s common case, without its frame
                    self.records[gateway].append(encode_batch(events))
                else:
                    self.put(gateway, events)

    def put_routed(self, events: list) -> None:
        """Events for any gateways (a commit's confirms) ready to go."""
        self.put_each(self.route(events))

    def waiting(self) -> bool:
        return any(self.records)

    def sent(self, gateway: int, count: int) -> None:
        """The first `count` records of `gateway` are in its ring."""
        del self.records[gateway][:count]

    def drop(self, gateway: int) -> None:
        """The gateway died: nothing waits for it any more."""
        self._turn[gateway].clear()
        self.records[gateway].clear()
