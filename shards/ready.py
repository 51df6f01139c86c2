"""Where a priority queue keeps its ready messages (shards/queue.py): one deque
per priority, behind the interface of the deque a plain queue uses. pip install
compiles this module as it is (warren.shards._ready), the build the compiled
queue calls per message."""

from __future__ import annotations

from collections import deque

from .message import RichMessage


class PriorityReady:
    """The ready messages of a priority queue: one deque per priority, served
    highest first; the same interface as the deque of a plain queue."""

    __slots__ = ("levels", "order", "count")

    def __init__(self):
        self.levels: dict[int, deque] = {}
        self.order: list[int] = []  # priorities present, highest first
        self.count = 0

    def append(self, msg: RichMessage) -> None:
        level = self.levels.get(msg.priority)
        if level is None:
            level = self.levels[msg.priority] = deque()
            self.order = sorted(self.levels, reverse=True)
        level.append(msg)
        self.count += 1

    def __getitem__(self, index: int) -> RichMessage:
        if index != 0 or not self.count:
            raise IndexError(index)
        for priority in self.order:
            if self.levels[priority]:
                return self.levels[priority][0]
        raise IndexError(index)

    def popleft(self) -> RichMessage:
        for priority in self.order:
            level = self.levels[priority]
            if level:
                self.count -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for priority in self.order:
            yield from self.levels[priority]

    def clear(self) -> None:
        self.levels.clear()
        self.order = []
        self.count = 0
