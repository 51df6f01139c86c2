"""A channel's prefetch limits as a small pure piece: how much link credit each
consumer may be dealt.

A consumer's own limit (basic.qos global=false) is enforced by its shard; the
gateway only avoids dealing it credit it could not use. The channel-wide limit
(basic.qos global=true) is the gateway's: its manual-ack consumers share it, and
credit outstanding at the shards plus unacked deliveries never exceeds it
(docs/architecture.md).
"""

from __future__ import annotations


def room(prefetch: int, unacked: int, credit: int) -> int | None:
    """Credit a consumer could still use under its own limit; None when it has none."""
    if not prefetch:
        return None
    return max(prefetch - unacked - max(credit, 0), 0)


def deal(limit: int, unacked: int, credits: list[int], rooms: list[int | None]) -> list[int]:
    """The credit to grant each consumer of a channel limited to `limit`, with
    `unacked` deliveries unsettled and consumers holding `credits` with `rooms`
    (room()): the free credit, one at a time to each consumer that can use more,
    least-served first, so it never sits idle with one consumer while another of
    the channel could use it."""
    free = limit - unacked - sum(max(credit, 0) for credit in credits)
    grants = [0] * len(credits)
    if free <= 0:
        return grants
    order = sorted(range(len(credits)), key=lambda i: credits[i])
    while free > 0:
        takers = [i for i in order if (room := rooms[i]) is None or room > grants[i]]
        if not takers:
            break
        for i in takers[:free]:
            grants[i] += 1
        free -= min(free, len(takers))
    return grants
