"""What a queue's step asks of the shard besides its records for the gateway
(shards/queue.py): storage effects (Persist, Remove, Delivered, CountsChanged),
a refused publish, a queue gone. Plain values the shard tells apart by class, the
same for either build of the queue: msgspec builds them in C, faster than a
compiled class would, so this module is not compiled. Compared and hashed by
identity (eq=False), and not tracked by the cyclic garbage collector (they form
no cycles)."""

from __future__ import annotations

import msgspec

from .message import Message


class Persist(msgspec.Struct, gc=False, eq=False):
    """Storage effect: write these messages of a durable queue. `rich`: they
    expire by themselves in a queue that does not track every message, so
    recovery must read their properties."""

    qid: int
    messages: list[Message]
    rich: bool = False


class Remove(msgspec.Struct, gc=False, eq=False):
    """Storage effect: delete these sequence numbers of a durable queue."""

    qid: int
    seqs: list[int]


class Delivered(msgspec.Struct, gc=False, eq=False):
    """Storage effect: a stored message went out for the first time, so after a
    crash it must come back marked redelivered. `in_order`: the queue hands its
    messages out for the first time in sequence order (it has no priorities), so
    every stored message up to this one went out too."""

    qid: int
    seq: int
    rich: bool = False
    in_order: bool = False


class Refused(msgspec.Struct, gc=False, eq=False):
    """A publish this queue turned away (x-overflow reject-publish): the
    publisher's confirm becomes a nack."""

    qid: int


class CountsChanged(msgspec.Struct, gc=False, eq=False):
    """Storage effect: a stored message's return counts changed (quorum queues)."""

    qid: int
    seq: int
    delivery_count: int
    acquired: int


class Destroyed(msgspec.Struct, gc=False, eq=False):
    """The queue no longer exists; the shell forgets it (and its stored messages)."""

    qid: int
