"""Failed logins slow down (broker/auth.LoginThrottle, a pure class driven here by
an explicit clock): after a few failures from one address, its further refusals
are answered after a growing delay, one after another, its further logins are
checked only at their turn, and refusals broker-wide are bounded per second.
tests/e2e/test_e2e_login_throttle.py has the same through a broker's AMQP and
management API."""

from __future__ import annotations

import logging

import pytest

from warren.gateway.broker.access import AccessControl
from warren.gateway.broker.auth import LoginThrottle


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guess(throttle: LoginThrottle, clock: Clock, address: str) -> float:
    """One failed login as a connection makes it, one after another: it waits its
    turn if its address is throttled, then its refusal's delay. The seconds from
    its credentials to its refusal."""
    began = clock.now
    at_turn = throttle.throttled(address)
    if at_turn:
        clock.now += throttle.turn(address)
    clock.now += throttle.failed(address, at_turn)
    return clock.now - began


def test_delays_start_after_the_free_failures_and_double_to_the_cap():
    clock = Clock()
    throttle = LoginThrottle(free=3, first=0.5, cap=4.0, clock=clock)
    assert [guess(throttle, clock, "192.0.2.1") for _ in range(9)] == \
        [0, 0, 0, 0.5, 1, 2, 4, 4, 4]
    assert guess(throttle, clock, "192.0.2.2") == 0  # another address starts afresh


def test_parallel_refusals_from_one_address_come_one_after_another():
    throttle = LoginThrottle(free=2, first=0.5, cap=4.0, longest=10.0, clock=Clock())
    # all at once, before the address is throttled: each waits for the one before
    assert [throttle.failed("192.0.2.1") for _ in range(7)] == \
        [0, 0, 0.5, 1.5, 3.5, 7.5, 10]  # no answer waits more than `longest`


def test_a_throttled_address_s_logins_are_checked_one_at_a_time():
    clock = Clock()
    throttle = LoginThrottle(free=2, first=0.5, cap=2.0, longest=5.0, clock=clock)
    assert not throttle.throttled("192.0.2.1")
    assert throttle.turn("192.0.2.1") == 0  # not throttled: checked at once
    throttle.failed("192.0.2.1")
    throttle.failed("192.0.2.1")
    assert throttle.throttled("192.0.2.1")
    # parallel attempts: each turn comes a delay after the one before (taken as
    # failing), and one too far off is refused unchecked
    assert [throttle.turn("192.0.2.1") for _ in range(4)] == [0.5, 1.5, 3.5, None]
    clock.now += 0.5
    assert throttle.failed("192.0.2.1", at_turn=True) == 0  # it waited already
    assert not throttle.throttled("192.0.2.2")


def test_refusals_broker_wide_are_bounded_per_second_and_none_is_free_beyond():
    clock = Clock()
    throttle = LoginThrottle(free=5, first=0.25, per_second=10.0, longest=30.0, clock=clock)
    # 100 addresses failing at once, each within its free failures: a second's
    # worth of refusals come at once, then 10 a second
    delays = [throttle.failed(f"192.0.2.{n}") for n in range(100)]
    # and over that rate no failure is free: each waits `first` at least
    assert delays == pytest.approx([0] * 10 + [max(0.25, n / 10) for n in range(1, 91)])
    clock.now += 60  # the flood is over: free again
    assert throttle.failed("198.51.100.2") == 0


def test_an_address_is_forgotten_after_a_quiet_while():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, cap=8.0, forget_after=60.0, clock=clock)
    assert [guess(throttle, clock, "192.0.2.1") for _ in range(3)] == [0, 1, 2]
    clock.now += 59
    assert throttle.throttled("192.0.2.1")  # still remembered
    guess(throttle, clock, "192.0.2.1")  # which renews it
    clock.now += 59
    assert throttle.throttled("192.0.2.1")
    clock.now += 60
    assert not throttle.throttled("192.0.2.1")
    assert throttle.failed("192.0.2.9") == 0
    assert len(throttle) == 1  # 192.0.2.1 was forgotten
    assert throttle.failed("192.0.2.1") == 0


def test_memory_is_bounded_by_forgetting_the_quietest_address():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, max_addresses=3, per_second=1e6, clock=clock)
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        throttle.failed(address)
        clock.now += 1
    throttle.failed("192.0.2.1")  # a second failure, and now the most recent
    throttle.failed("192.0.2.4")
    assert len(throttle) == 3 and throttle.throttled("192.0.2.1")  # 192.0.2.2 went
    assert not throttle.throttled("192.0.2.2")
    for n in range(5, 1000):
        throttle.failed(f"192.0.2.{n}")
    assert len(throttle) == 3
    assert not throttle.throttled("192.0.2.1")  # pushed out


def test_the_delay_stays_at_the_cap_however_many_failures():
    clock = Clock()
    throttle = LoginThrottle(free=0, first=0.25, cap=3.0, clock=clock)
    assert max(guess(throttle, clock, "192.0.2.1") for _ in range(5000)) == 3.0


def test_refusals_are_logged_and_counted_per_address(caplog):
    access = AccessControl(None)
    access.put_user("alice", "pw", [])
    access.throttle = LoginThrottle(free=2, first=1.0, clock=Clock())

    def refuse(name: str, password: str, address: str) -> float:
        delays = []
        access.login_failed(name, access.refusal(name, password, address), address, "PLAIN",
                            False, 0.0, delays.append)
        return delays[0]

    with caplog.at_level(logging.WARNING, logger="warren.access"):
        answers = [refuse("alice", "nope", "192.0.2.7") for _ in range(4)]
        assert refuse("mallory", "x", "192.0.2.8") == 0
    assert answers == [0, 0, 1, 3]  # one after another
    assert access.refusal("alice", "pw", "192.0.2.7") is None
    assert caplog.messages[0] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7)"
    assert caplog.messages[3] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7, answered in 3s)"
    assert caplog.messages[4] == \
        "PLAIN login refused: user 'mallory' - invalid credentials (from 192.0.2.8)"
