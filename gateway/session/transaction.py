"""A channel in transaction mode (tx.select): its publishes and settlements wait
for tx.commit, which carries them out in order, in one loop turn, and is
answered once every shard has stored its part; tx.rollback drops them."""

from __future__ import annotations

from typing import NamedTuple

from ..amqp import hotpath
from .confirms import ConfirmTracker


class TxPublish(NamedTuple):
    """A publish held for the commit: _route's arguments."""

    method: hotpath.Publish
    properties: bytes
    body: bytes
    expiration: int
    priority: int
    also: tuple  # CC / BCC routing keys


class TxSettle(NamedTuple):
    """An ack, nack or reject held for the commit."""

    taken: list  # (delivery tag, unacked.Delivery) pairs, out of the unacked map
    outcome: int


class Transaction:
    __slots__ = ("actions", "stored", "committing")

    def __init__(self) -> None:
        self.actions: list[TxPublish | TxSettle] = []
        self.stored = ConfirmTracker()  # the shards' acceptance of committed publishes
        self.committing = False  # a commit waits for `stored`

    def publish(self, action: TxPublish) -> None:
        self.actions.append(action)

    def settle(self, taken: list, outcome: int) -> None:
        self.actions.append(TxSettle(taken, outcome))

    def take(self) -> list[TxPublish | TxSettle]:
        """The actions of a commit, in the order the client sent them."""
        actions, self.actions = self.actions, []
        return actions

    def carried_out(self) -> bool:
        """The commit's actions went to the shards: True when commit-ok may go now,
        else the commit waits for `stored` (stored_all)."""
        self.committing = True
        return self.stored_all()

    def stored_all(self) -> bool:
        """True once, when a waiting commit's publishes are all stored."""
        if not self.committing or self.stored.outstanding:
            return False
        self.stored.take_replies()  # the acceptances are the commit-ok, not confirms
        self.committing = False
        return True

    def rollback(self) -> list:
        """Drop the actions; the deliveries their settlements took, to be unacked again."""
        returned = [pair for action in self.actions if type(action) is TxSettle
                    for pair in action.taken]
        self.actions = []
        return returned
