"""Message and byte rates: counters sampled once a second, a rate being the
change over the last few seconds. Sampling goes on whether or not anyone reads
the API, so the first request after traffic starts already shows it."""

from __future__ import annotations

from collections import deque

SAMPLE_INTERVAL = 1.0  # seconds between samples
WINDOW = 5.0  # seconds a rate averages over, as RabbitMQ's default statistics interval


class Rates:
    """Samples of counters by key (a queue, a connection, the broker's totals).
    Every counter starts at zero: a key first seen after `start` or after a
    sample was zero then (a queue declared, a connection opened since)."""

    def __init__(self, start: float) -> None:
        self._history: dict[object, deque] = {}  # key -> (time, counters), oldest first
        self._last_sample = start

    def sample(self, now: float, counters: dict[object, dict[str, int]]) -> None:
        """Record every key's counters at `now`; keys no longer given are forgotten."""
        for key in [k for k in self._history if k not in counters]:
            del self._history[key]
        for key, values in counters.items():
            history = self._history.get(key)
            if history is None:
                history = self._history[key] = deque([(self._last_sample,
                                                       dict.fromkeys(values, 0))])
            history.append((now, dict(values)))
            while len(history) > 2 and now - history[1][0] >= WINDOW:
                history.popleft()
        self._last_sample = now

    def rate(self, key, now: float, current: dict[str, int]) -> dict[str, float]:
        """Per-second rates of `current`'s counters over the last WINDOW seconds."""
        history = self._history.get(key)
        then, old = history[0] if history else (self._last_sample, {})
        elapsed = now - then
        if elapsed < 0.1:  # too short to say
            return dict.fromkeys(current, 0.0)
        # a counter that went down (its shard restarted) has no rate this window
        return {name: max(0.0, (value - old.get(name, 0)) / elapsed)
                for name, value in current.items()}
