"""The prefetch limiter's pure core (gateway/prefetch.py), driven directly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.session.prefetch import deal, room


def test_room_under_a_consumers_own_limit():
    assert room(0, 5, 3) is None  # no limit of its own
    assert room(10, 4, 3) == 3
    assert room(10, 8, 5) == 0  # never negative
    assert room(10, 4, -2) == 6  # credit overdrawn by deliveries in flight counts as none


def test_free_credit_goes_to_the_least_served_first():
    # limit 10, 4 unacked, credits 3 and 0 held: 3 free, the idle consumer first.
    assert deal(10, 4, [3, 0], [None, None]) == [1, 2]
    assert deal(5, 0, [0, 0, 0], [None, None, None]) == [2, 2, 1]


def test_no_credit_beyond_a_consumers_own_room():
    assert deal(10, 0, [0, 0], [1, None]) == [1, 9]
    assert deal(10, 0, [0, 0], [1, 2]) == [1, 2]  # the rest stays with the channel


def test_nothing_to_deal_when_the_limit_is_used():
    assert deal(4, 3, [1, 0], [None, None]) == [0, 0]
    assert deal(4, 6, [0], [None]) == [0]  # over the limit after a re-deal: none
    assert deal(4, 0, [], []) == []


consumers = st.lists(st.tuples(st.integers(-3, 20), st.one_of(st.none(), st.integers(0, 20))),
                     max_size=6)


@given(st.integers(1, 60), st.integers(0, 60), consumers)
def test_deal_respects_every_limit_and_leaves_no_usable_credit_idle(limit, unacked, held):
    credits = [credit for credit, _ in held]
    rooms = [r for _, r in held]
    grants = deal(limit, unacked, credits, rooms)
    assert len(grants) == len(held) and all(g >= 0 for g in grants)
    free = max(limit - unacked - sum(max(c, 0) for c in credits), 0)
    # The channel's limit: outstanding credit plus unacked never exceeds it.
    assert sum(grants) <= free
    # Each consumer's own room.
    assert all(r is None or g <= r for g, r in zip(grants, rooms))
    # Work-conserving: what is free goes out as far as someone can use it.
    usable = sum(free if r is None else r for r in rooms)
    assert sum(grants) == min(free, usable)
    # Fair: a consumer short of its room got at least as much as any other, less one.
    for i, (g, r) in enumerate(zip(grants, rooms)):
        if r is None or g < r:
            assert all(other <= g + 1 for other in grants), (i, grants)
