"""How a relay (relay.py) renames the ids in the records it passes on, pure.

A shard sends each delivery, confirm and consumer's end to the gateway whose
number the id carries (`records.gateway_of`). A relay is one more gateway of
its node's shards, slot G, so the ids a remote gateway made must carry G there,
and come back as they were. The mapping keeps no table: an id `x` made on node
`k` (0 < k < 64) is `(x * 64 + k) * 64 + G` on the relay's node; from such an
id the relay reads `k` and `x`, and `x`'s own gateway number says which of node
k's gateway processes (which link) it belongs to.
"""

from __future__ import annotations

from warren.shards.records import (
    MAX_GATEWAYS,
    Alarm,
    Cancel,
    Confirmed,
    Consume,
    ConsumerCancelled,
    ConsumerTimedOut,
    Deliver,
    Get,
    Grant,
    Publish,
    QueueDeleted,
    Rejected,
    ReleaseHolders,
    Renew,
    Settle,
)

_HOLDING = frozenset((Cancel, Settle, Renew, Grant))
_TO_HOLDER = frozenset((Deliver, ConsumerCancelled, ConsumerTimedOut))
_TO_ALL = frozenset((Alarm, QueueDeleted))


_SQUARE = MAX_GATEWAYS * MAX_GATEWAYS


def to_local(ident: int, node: int, slot: int) -> int:
    """The id on the relay's node for id `ident` of node `node`."""
    return (ident * MAX_GATEWAYS + node) * MAX_GATEWAYS + slot


def to_remote(ident: int) -> int:
    """The id as its node made it."""
    return ident // _SQUARE


def sender_of(ident: int) -> tuple[int, int]:
    """(node, gateway) of the link a mapped id came in on."""
    return (ident // MAX_GATEWAYS) % MAX_GATEWAYS, to_remote(ident) % MAX_GATEWAYS


def map_command(record, node: int, slot: int) -> int:
    """Rename the ids of a command from node `node` in place, for slot `slot`;
    the holder it makes (a consumer, a basic.get's channel: to release should
    the link go), else 0."""
    kind = type(record)
    if kind is Publish:
        if record.confirm_channel:
            record.confirm_channel = to_local(record.confirm_channel, node, slot)
        return 0
    if kind in _HOLDING:
        record.holder = to_local(record.holder, node, slot)
        return 0
    if kind is Get:
        record.holder = to_local(record.holder, node, slot)
        return record.holder
    if kind is Consume:
        record.holder = to_local(record.holder, node, slot)
        record.channel = to_local(record.channel, node, slot)
        return record.holder
    if kind is ReleaseHolders:
        record.holders = [to_local(holder, node, slot) for holder in record.holders]
    return 0


def route_events(events: list, senders) -> dict:
    """A shard's events for the relay's slot, renamed back, by the (node, gateway)
    they go to: a holder's to its sender's, confirms split by their channels'
    senders, the events for every gateway (alarms, a queue's deletion) to each of
    `senders`. What concerns no sender now is left out."""
    out: dict = {}
    # deliveries come in runs to one consumer: one lookup a run
    run_holder, run = 0, []
    for event in events:
        kind = type(event)
        if kind is Deliver and event.holder == run_holder:
            event.holder = run_holder // _SQUARE
            run.append(event)
        elif kind in _TO_HOLDER:
            holder = event.holder
            key = sender_of(holder)
            if key in senders:
                event.holder = holder // _SQUARE
                run = out.setdefault(key, [])
                run.append(event)
                run_holder = holder if kind is Deliver else 0
            else:
                run_holder = 0
        elif kind is Confirmed or kind is Rejected:
            split: dict = {}
            for channel, seq in zip(event.channels, event.seqs):
                key = sender_of(channel)
                if key in senders:
                    channels, seqs = split.setdefault(key, ([], []))
                    channels.append(to_remote(channel))
                    seqs.append(seq)
            for key, (channels, seqs) in split.items():
                out.setdefault(key, []).append(kind(channels, seqs))
        elif kind in _TO_ALL:
            for key in senders:
                out.setdefault(key, []).append(event)
    return out
