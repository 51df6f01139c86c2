"""gateway.logthrottle: each kind of client error logged at most `burst` times a
period, the rest counted (issue 56.6: 998 bad connections in 20 s wrote 336 MB)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.logthrottle import LOG, SUPPRESS, SUPPRESS_FIRST, LogThrottle


def test_a_burst_is_logged_then_counted_until_the_period_ends():
    throttle = LogThrottle(burst=3, period=1.0)
    verdicts = [throttle.admit("handshake", 10.0 + n * 0.01) for n in range(6)]
    assert verdicts == [LOG, LOG, LOG, SUPPRESS_FIRST, SUPPRESS, SUPPRESS]
    assert throttle.period_left("handshake", 10.05) == pytest.approx(0.95)
    assert throttle.admit("other kind", 10.06) == LOG
    assert throttle.take_suppressed("handshake") == 3
    assert throttle.take_suppressed("handshake") == 0
    assert throttle.admit("handshake", 11.0) == LOG  # a new period
    assert throttle.take_suppressed("never seen") == 0


@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 0.5)), max_size=200))
@settings(max_examples=100, deadline=None)
def test_every_record_is_logged_or_counted_and_no_period_logs_more_than_the_burst(steps):
    throttle = LogThrottle(burst=4, period=1.0)
    now = 0.0
    logged: dict[str, list[float]] = {}
    counted = {kind: 0 for kind in "abc"}
    armed = {kind: False for kind in "abc"}
    for kind, wait in steps:
        now += wait
        verdict = throttle.admit(kind, now)
        if verdict == LOG:
            logged.setdefault(kind, []).append(now)
        else:
            # the first record held back since the count was taken arms the report
            assert (verdict == SUPPRESS_FIRST) == (not armed[kind])
            armed[kind] = True
        if armed[kind] and wait > 0.45:  # the report's timer ran: the count is taken
            counted[kind] += throttle.take_suppressed(kind)
            armed[kind] = False
    for kind in "abc":
        counted[kind] += throttle.take_suppressed(kind)
        times = logged.get(kind, [])
        assert len(times) + counted[kind] == sum(1 for k, _ in steps if k == kind)
        # A span shorter than a period meets two periods at most: 2 bursts.
        for i, start in enumerate(times[:-8]):
            assert times[i + 8] - start >= 1.0
