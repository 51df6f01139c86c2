"""The queue state machine a shard runs: queue.py compiled as it is
(warren.shards._queue, typed by _queue.pxd: setup.py) where pip install built it,
else queue.py itself (shards/build.py). Its effects are told apart by
class, so the shard takes them all from the one build its queues come from."""

from __future__ import annotations

from . import build
from . import queue as pure

queue = build.twin(pure, "warren.shards._queue")

Queue, Message = queue.Queue, queue.Message
Persist, Remove, Delivered, Refused = queue.Persist, queue.Remove, queue.Delivered, queue.Refused
CountsChanged, Destroyed = queue.CountsChanged, queue.Destroyed
