"""A channel in transaction mode (tx.select): its publishes and settlements wait
for tx.commit, which carries them out in order, in one loop turn, and is
answered once every shard has stored its part; tx.rollback drops them."""

from __future__ import annotations

from .confirms import ConfirmTracker

PUBLISH, SETTLE = "publish", "settle"


class Transaction:
    __slots__ = ("actions", "stored", "committing")

    def __init__(self) -> None:
        self.actions: list[tuple[str, tuple]] = []  # (PUBLISH, route args) or (SETTLE, (taken, outcome))
        self.stored = ConfirmTracker()  # the shards' acceptance of committed publishes
        self.committing = False  # a commit waits for `stored`

    def publish(self, *route_args) -> None:
        self.actions.append((PUBLISH, route_args))

    def settle(self, taken: list, outcome: int) -> None:
        self.actions.append((SETTLE, (taken, outcome)))

    def take(self) -> list[tuple[str, tuple]]:
        """The actions of a commit, in the order the client sent them."""
        actions, self.actions = self.actions, []
        return actions

    def rollback(self) -> list:
        """Drop the actions; the deliveries their settlements took, to be unacked again."""
        returned = [pair for kind, args in self.actions if kind == SETTLE for pair in args[0]]
        self.actions = []
        return returned
