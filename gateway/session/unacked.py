"""A channel's unacknowledged deliveries by delivery tag, with RabbitMQ's rules
for settling them (rabbit_channel's collect_acks): `multiple` settles every tag
up to the one given, tag 0 with `multiple` settles all, an unknown tag is 406."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import msgspec

from ..amqp import spec
from ..errors import AMQPError

if TYPE_CHECKING:
    from .ports import Shard


class Delivery(msgspec.Struct):
    """Where a delivered message waits to be settled. (A Struct: made without a
    Python frame, as a NamedTuple is not; one per manual-ack delivery.)"""

    link: Shard  # the ShardLink of the queue's shard
    qid: int
    holder: int  # the consumer's id, or the channel's for basic.get
    seq: int  # the message's sequence number in its queue


class Unacked:
    __slots__ = ("_by_tag",)

    def __init__(self) -> None:
        self._by_tag: OrderedDict[int, Delivery] = OrderedDict()  # in tag order

    def __len__(self) -> int:
        return len(self._by_tag)

    def add(self, tag: int, delivery: Delivery) -> None:
        """Tags are added in increasing order (the channel counts them up)."""
        self._by_tag[tag] = delivery

    def get(self, tag: int) -> Delivery | None:
        return self._by_tag.get(tag)

    def pop(self, tag: int) -> Delivery | None:
        """Remove and return the delivery of `tag` (None if there is none)."""
        return self._by_tag.pop(tag, None)

    def take(self, tag: int, multiple: bool) -> list[tuple[int, Delivery]]:
        """Remove and return what an ack, nack or reject of `tag` settles."""
        by_tag = self._by_tag
        if multiple and tag == 0:
            return self.take_all()
        if tag not in by_tag:
            raise AMQPError(spec.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        if not multiple:
            return [(tag, by_tag.pop(tag))]
        taken = []
        while True:
            first, delivery = by_tag.popitem(last=False)
            taken.append((first, delivery))
            if first == tag:
                return taken

    def take_all(self) -> list[tuple[int, Delivery]]:
        taken = list(self._by_tag.items())
        self._by_tag.clear()
        return taken

    def restore(self, taken: list[tuple[int, Delivery]]) -> None:
        """Put settled deliveries back (a rolled-back transaction), in tag order."""
        if taken:
            self._by_tag = OrderedDict(sorted([*self._by_tag.items(), *taken]))

    def tags_of(self, holder: int, seqs: set[int]) -> set[int]:
        """The tags of `holder`'s deliveries of these messages."""
        return {tag for tag, d in self._by_tag.items() if d.holder == holder and d.seq in seqs}
