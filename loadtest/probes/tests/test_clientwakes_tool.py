"""The client wake-up tracer's pure part (loadtest/probes/clientwakes.py): telling a
client's sleeps that a delivery ended from those its timer ended, in perf
script's output."""

from __future__ import annotations

import pytest

from warren.loadtest.probes.clientwakes import analyse


def enter(tid: int, at: float, timeout: int) -> str:
    return (f"{tid:>6}  {at:.6f}: syscalls:sys_enter_epoll_pwait: epfd: 0x00000004, "
            f"events: 0xc0000cd858, maxevents: 0x00000080, timeout: 0x{timeout & 0xffffffff:08x}, "
            "sigmask: 0x00000000, sigsetsize: 0x00000000")


def leave(tid: int, at: float, ready: int) -> str:
    return f"{tid:>6}  {at:.6f}:  syscalls:sys_exit_epoll_pwait: 0x{ready:x}"


def test_a_sleep_a_delivery_ends_is_timed_and_one_the_timer_ends_is_counted():
    wakes = analyse([
        enter(7, 100.000000, 1), leave(7, 100.000050, 1),  # a delivery after 50 µs
        enter(7, 100.000100, 1), leave(7, 100.001180, 0),  # the 1 ms timer: nothing came
        enter(7, 100.001200, -1), leave(7, 100.001290, 2),  # no timer at all: 90 µs
    ])
    assert (wakes.delivery_wakes, wakes.timer_wakes) == (2, 1)
    assert wakes.waits_us == pytest.approx([50, 90])
    assert wakes.seconds == pytest.approx(0.00129)
    assert wakes.per_s(wakes.delivery_wakes) == pytest.approx(2 / 0.00129)
    assert (wakes.wait_percentile(0.1), wakes.wait_percentile(0.9)) == pytest.approx((50, 90))


def test_go_s_polls_between_goroutines_are_not_sleeps():
    wakes = analyse([
        enter(7, 1.0, 0), leave(7, 1.000001, 1),  # timeout 0: a poll, ready at once
        enter(7, 1.00001, 0), leave(7, 1.000011, 0),
    ])
    assert (wakes.delivery_wakes, wakes.timer_wakes) == (0, 0)
    assert wakes.wait_percentile(0.5) is None


def test_each_thread_s_sleep_ends_with_its_own_return():
    wakes = analyse([
        enter(7, 5.000000, 1),
        enter(8, 5.000010, 0), leave(8, 5.000011, 1),  # another thread's poll meanwhile
        leave(7, 5.000040, 1),
        leave(9, 5.000050, 1),  # a return whose call began before the trace: unknown
        "some line perf prints that is no event",
    ])
    assert (wakes.delivery_wakes, wakes.timer_wakes) == (1, 0)
    assert wakes.waits_us == pytest.approx([40])
