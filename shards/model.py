"""The queue state machine a shard runs: queue.py compiled as it is
(warren.shards._queue, typed by _queue.pxd: setup.py) where pip install built it,
else queue.py itself (shards.compiled.chosen). Its effects are told apart by
class, so the shard takes them all from the one build its queues come from."""

from __future__ import annotations

from . import queue as pure
from .compiled import built_module, chosen

queue = chosen(pure, built_module("warren.shards._queue"))

Queue, Message = queue.Queue, queue.Message
Persist, Remove, Delivered, Refused = queue.Persist, queue.Remove, queue.Delivered, queue.Refused
CountsChanged, Destroyed = queue.CountsChanged, queue.Destroyed
