"""A queue's consumers (shards/queue.py): who receives next (highest priority
first, round-robin among equals, or only the oldest with
x-single-active-consumer), whether one may take a message now (credit,
prefetch), and how long each may hold what it was given (consumer timeouts of
quorum queues). pip install compiles this module as it is
(warren.shards._consumers, typed by _consumers.pxd): the queue's compiled build
calls into it as C functions."""

from __future__ import annotations

import heapq
from collections import deque

from .records import Consume


class Consumer:
    __slots__ = ("holder", "channel", "tag", "no_ack", "exclusive", "prefetch", "credit",
                 "priority", "timeout", "timed_out")

    def __init__(self, c: Consume):
        self.holder = c.holder
        self.channel = c.channel
        self.tag = c.tag
        self.no_ack = c.no_ack
        self.exclusive = c.exclusive
        self.prefetch = c.prefetch
        self.credit = c.credit
        self.priority = c.priority
        self.timeout = c.timeout_ms / 1000 if c.timeout_ms else None  # lock length, seconds
        self.timed_out: set[int] = set()  # its timed-out messages not yet settled by it


class Roster:
    """The consumers of one queue, and the locks on the messages they hold."""

    __slots__ = ("consumers", "rotations", "priorities", "single_active", "locks", "lock_heap")

    def __init__(self):
        self.consumers: dict[int, Consumer] = {}  # by holder, oldest first
        # Round-robin order per consumer priority; `priorities` lists the keys,
        # highest first, kept sorted as consumers come and go.
        self.rotations: dict[int, deque[int]] = {}
        self.priorities: list[int] = []
        self.single_active = False
        # Consumer timeouts: when each checked-out message's lock ends, by (holder,
        # seq), and a heap of (deadline, holder, seq) whose stale entries (settled,
        # renewed) are skipped when they come up.
        self.locks: dict[tuple[int, int], float] = {}
        self.lock_heap: list[tuple[float, int, int]] = []

    def add(self, c: Consume) -> Consumer | None:
        """The consumer `c` asks for, or None when exclusivity refuses it."""
        consumers = self.consumers
        if consumers and (c.exclusive or any(other.exclusive for other in consumers.values())):
            return None
        consumer = Consumer(c)
        consumers[c.holder] = consumer
        if consumer.priority not in self.rotations:
            self.rotations[consumer.priority] = deque()
            self.priorities = sorted(self.rotations, reverse=True)
        self.rotations[consumer.priority].append(c.holder)
        return consumer

    def remove(self, holder: int) -> None:
        consumer = self.consumers.pop(holder, None)
        if consumer is None:
            return
        rotation = self.rotations[consumer.priority]
        rotation.remove(holder)
        if not rotation:
            del self.rotations[consumer.priority]
            self.priorities = sorted(self.rotations, reverse=True)

    def clear(self) -> None:
        """Everyone goes (the queue was deleted). In place: the queue holds the
        containers it reads on the per-message path."""
        self.consumers.clear()
        self.rotations.clear()
        self.priorities = []
        self.locks.clear()
        self.lock_heap.clear()

    def _can_take(self, c: Consumer, holdings: dict) -> bool:
        if c.credit <= 0 or c.timed_out:
            return False
        if c.no_ack or c.prefetch == 0:
            return True
        held = holdings.get(c.holder)
        return held is None or len(held) < c.prefetch

    def next_consumer(self, holdings: dict) -> Consumer | None:
        """Who takes the next message, given what each holds (`holdings`: holder ->
        seq -> message): highest priority first; round-robin among consumers of
        equal priority. With x-single-active-consumer only the oldest consumer
        receives; the next one takes over when it goes."""
        if self.single_active:
            active = next(iter(self.consumers.values()), None)
            return active if active is not None and self._can_take(active, holdings) else None
        for priority in self.priorities:
            rotation = self.rotations[priority]
            for _ in range(len(rotation)):
                consumer = self.consumers[rotation[0]]
                rotation.rotate(-1)
                if self._can_take(consumer, holdings):
                    return consumer
        return None

    # -- consumer timeouts ---------------------------------------------------------

    def lock(self, holder: int, seq: int, now: float) -> None:
        """Message `seq` went to `holder` at `now`: a consumer with a timeout may
        keep it that long."""
        consumer = self.consumers.get(holder)
        if consumer is not None and consumer.timeout is not None:
            self._lock(holder, seq, now + consumer.timeout)

    def _lock(self, holder: int, seq: int, deadline: float) -> None:
        self.locks[(holder, seq)] = deadline
        heapq.heappush(self.lock_heap, (deadline, holder, seq))

    def renew(self, holder: int, seqs: list[int], now: float) -> None:
        """`holder` asks for more time, from `now`, for those of `seqs` it still holds."""
        consumer = self.consumers.get(holder)
        if consumer is None or consumer.timeout is None:
            return
        deadline = now + consumer.timeout
        for seq in seqs:
            if (holder, seq) in self.locks:
                self._lock(holder, seq, deadline)

    def next_lock(self) -> float | None:
        """When the first lock ends, or None."""
        heap = self.lock_heap
        while heap:
            deadline, holder, seq = heap[0]
            if self.locks.get((holder, seq)) == deadline:
                return deadline
            heapq.heappop(heap)  # settled or renewed since
        return None

    def due(self, now: float) -> dict[int, list[int]]:
        """The locks ended by `now`, by holder, taken off."""
        ended: dict[int, list[int]] = {}
        while (deadline := self.next_lock()) is not None and deadline <= now:
            _, holder, seq = heapq.heappop(self.lock_heap)
            del self.locks[(holder, seq)]
            ended.setdefault(holder, []).append(seq)
        return ended
