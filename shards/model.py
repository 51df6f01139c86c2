"""The queue state machine a shard runs: queue.py compiled as it is
(warren.shards._queue, typed by _queue.pxd: setup.py) where pip install built it,
else queue.py itself (shards/build.py). Its messages (message.py) and effects
(effects.py) are the same classes for either build."""

from __future__ import annotations

from . import build
from . import queue as pure

queue = build.twin(pure, "warren.shards._queue")

Queue = queue.Queue
