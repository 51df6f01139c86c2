"""The batch codec both processes run (batches.py): compiled as it is
(warren.shards._batches: setup.py) where pip install built it, else batches.py
itself (shards/build.py)."""

from __future__ import annotations

from . import batches as pure
from . import build

batches = build.twin(pure, "warren.shards._batches")

encode_batch, decode_commands, decode_events = (
    batches.encode_batch, batches.decode_commands, batches.decode_events)
