"""How often a kind of client error is logged, sans-IO.

A client decides how often the broker logs its errors: one per connection it
opens, or per channel it breaks (issue 56.6: 998 connections in 20 s wrote
336 MB of log). Each kind is logged at most `burst` times a `period`; the rest
are counted, and the caller logs the count when the period ends (admit says
when to arm that timer; take_suppressed hands the count over).
"""

from __future__ import annotations

LOG = "log"  # log this record
SUPPRESS_FIRST = "suppress first"  # drop it, and arm the timer that reports the count
SUPPRESS = "suppress"  # drop it (the timer is armed)


class LogThrottle:
    def __init__(self, burst: int, period: float):
        self.burst = burst
        self.period = period
        # kind -> [the period's start, records logged in it, records not logged
        # since the count was last taken]
        self._kinds: dict[str, list] = {}

    def admit(self, kind: str, now: float) -> str:
        """LOG, SUPPRESS_FIRST or SUPPRESS for a record of `kind` at `now`."""
        state = self._kinds.get(kind)
        if state is None:
            state = self._kinds[kind] = [now, 0, 0]
        elif now - state[0] >= self.period:
            state[0], state[1] = now, 0
        if state[1] < self.burst:
            state[1] += 1
            return LOG
        state[2] += 1
        return SUPPRESS_FIRST if state[2] == 1 else SUPPRESS

    def period_left(self, kind: str, now: float) -> float:
        """Seconds until the period of `kind` that runs at `now` ends."""
        return max(0.0, self._kinds[kind][0] + self.period - now)

    def take_suppressed(self, kind: str) -> int:
        """How many records of `kind` were not logged since the last call."""
        state = self._kinds.get(kind)
        if state is None:
            return 0
        count, state[2] = state[2], 0
        return count
