"""The shard's timers as a heap, so a loop turn pays for the timers that are due,
not for every queue that has timed work.

A key (a queue id, or the persister's retry) has at most one live deadline. The
heap holds (deadline, n, key) entries; an entry whose deadline is no longer its
key's is stale and skipped when it comes up (lazy invalidation). A deadline is
a lower bound: scheduling a later one than the key's live one changes nothing,
so a queue whose head message moves on pushes nothing; the early entry comes
due, the owner finds nothing to do yet and schedules the real deadline.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable

COMPACT_BELOW = 64  # heaps smaller than this are never rebuilt


class TimerHeap:
    def __init__(self):
        # public: the loop asks whether it is empty before calling next_deadline
        self.heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, float] = {}  # key -> its deadline in the heap
        self._order = itertools.count()  # ties: first scheduled first, keys never compared

    def schedule(self, key: Hashable, deadline: float | None) -> None:
        """Wake `key` by `deadline` (None: it has no timed work)."""
        if deadline is None:
            self._live.pop(key, None)
            return
        live = self._live.get(key)
        if live is not None and live <= deadline:
            return
        self._live[key] = deadline
        heapq.heappush(self.heap, (deadline, next(self._order), key))
        if len(self.heap) > COMPACT_BELOW and len(self.heap) > 2 * len(self._live):
            self._compact()  # mostly stale: keys cancelled, or moved earlier

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def due(self, now: float) -> list:
        """The keys whose deadline has come, in deadline order; they are unscheduled
        (the owner schedules their next deadline)."""
        heap, live, keys = self.heap, self._live, []
        while heap and heap[0][0] <= now:
            deadline, _, key = heapq.heappop(heap)
            if live.get(key) == deadline:
                del live[key]
                keys.append(key)
        return keys

    def next_deadline(self) -> float | None:
        """The earliest live deadline, for the loop's sleep."""
        heap, live = self.heap, self._live
        while heap and live.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def __len__(self) -> int:
        return len(self._live)

    def _compact(self) -> None:
        self.heap = [entry for entry in self.heap if self._live.get(entry[2]) == entry[0]]
        heapq.heapify(self.heap)
