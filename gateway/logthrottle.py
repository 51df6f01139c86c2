"""How often a kind of client error is logged.

A client decides how often the broker logs its errors: one per connection it
opens, or per channel it breaks (issue 56.6: 998 connections in 20 s wrote
336 MB of log). Each kind is logged at most `burst` times a `period`; the rest
are counted, and their count is logged when the period ends. LogThrottle keeps
the counts (sans-IO: admit says when to arm the timer that logs the count,
take_suppressed hands it over); log_client_error logs through the process's
one throttle, on the clock it is given (the session's Clock port; a loop).
"""

from __future__ import annotations

import logging
from typing import Any

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


CLIENT_ERRORS_PER_SECOND = 10  # of each kind, in a gateway process
_client_errors = LogThrottle(CLIENT_ERRORS_PER_SECOND, 1.0)
log = logging.getLogger("warren.connection")


def log_client_error(clock: Any, kind: str, level: int, message: str, *args, **kwargs) -> None:
    """Log a client's error (log.log's arguments) unless too many of its `kind`
    came this second by `clock` (its time and call_later); the first one held back
    arms the line that counts them."""
    now = clock.time()
    verdict = _client_errors.admit(kind, now)
    if verdict == LOG:
        log.log(level, message, *args, **kwargs)
    elif verdict == SUPPRESS_FIRST:
        clock.call_later(_client_errors.period_left(kind, now), _log_suppressed, kind, level)


def _log_suppressed(kind: str, level: int) -> None:
    count = _client_errors.take_suppressed(kind)
    if count:
        log.log(level, "%d more client errors of this kind not logged in the last second "
                "(%s): more than %d a second", count, kind, CLIENT_ERRORS_PER_SECOND)
