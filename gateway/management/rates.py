"""Message and byte rates: counters sampled once a second, a rate being the
change over the last few seconds. Sampling goes on whether or not anyone reads
the API, so the first request after traffic starts already shows it."""

from __future__ import annotations

from collections import deque

SAMPLE_INTERVAL = 1.0  # seconds between samples
WINDOW = 5.0  # seconds a rate averages over, as RabbitMQ's default statistics interval


class Rates:
    def __init__(self) -> None:
        self._history: dict[object, deque] = {}  # key -> (time, counters), oldest first
        self._last_sample: float | None = None

    def sample(self, now: float, counters: dict[object, dict[str, int]]) -> None:
        """Record every key's counters at `now`; keys no longer given are forgotten.
        A key first seen after an earlier sample started from zero since then (a
        queue declared, a connection opened)."""
        for key in [k for k in self._history if k not in counters]:
            del self._history[key]
        for key, values in counters.items():
            history = self._history.get(key)
            if history is None:
                history = self._history[key] = deque()
                if self._last_sample is not None:
                    history.append((self._last_sample, dict.fromkeys(values, 0)))
            history.append((now, dict(values)))
            while len(history) > 2 and now - history[1][0] >= WINDOW:
                history.popleft()
        self._last_sample = now

    def rate(self, key, now: float, current: dict[str, int]) -> dict[str, float]:
        """Per-second rates of `current`'s counters over the last WINDOW seconds
        of samples (0.0 before a key has one)."""
        history = self._history.get(key)
        if not history or now - history[0][0] < 0.1:
            return dict.fromkeys(current, 0.0)
        then, old = history[0]
        elapsed = now - then
        # a counter that went down (its shard restarted) has no rate this window
        return {name: max(0.0, (value - old.get(name, 0)) / elapsed)
                for name, value in current.items()}
