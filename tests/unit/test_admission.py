"""The management listener's connection caps (gateway/management/admission.py),
over any sequence of connections opening and closing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.management.admission import Admission, total_cap

ADDRESSES = st.sampled_from(["127.0.0.1", "10.0.0.1", "10.0.0.2", "::1"])


@given(st.integers(1, 8), st.integers(1, 8),
       st.lists(st.tuples(st.booleans(), ADDRESSES, st.integers(0, 50)), max_size=200))
def test_caps_hold_and_closing_frees_a_place(total, per_address, steps):
    admission = Admission(total, per_address)
    open_: list[str] = []  # addresses of the admitted connections still open
    refused = 0
    for opening, address, which in steps:
        if opening:
            mine = open_.count(address)
            reason = admission.admit(address)
            assert (reason is None) == (len(open_) < total and mine < per_address)
            if reason is None:
                open_.append(address)
            else:
                refused += 1
        elif open_:
            admission.release(open_.pop(which % len(open_)))
        assert admission.count == len(open_) <= total
        assert all(admission.open[a] == open_.count(a) <= per_address for a in set(open_))
        assert set(admission.open) == set(open_)
    assert admission.refused == refused


def test_the_total_cap_leaves_three_quarters_of_the_descriptors():
    assert total_cap(512, 1024) == 256
    assert total_cap(512, 1 << 20) == 512
    assert total_cap(512, 2) == 1
    assert total_cap(512, -1) == 512  # no limit
