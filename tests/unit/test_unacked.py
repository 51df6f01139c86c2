"""A channel's unacknowledged deliveries, driven in-process against a plain model
of RabbitMQ's collect_acks rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.amqp import spec
from warren.gateway.errors import AMQPError
from warren.gateway.session.unacked import Delivery, Unacked


def delivery(tag: int, holder: int = 1) -> Delivery:
    return Delivery(None, 7, holder, tag * 10)


operations = st.lists(st.one_of(
    st.tuples(st.just("deliver"), st.integers(1, 3)),
    st.tuples(st.just("settle"), st.integers(0, 25), st.booleans()),
    st.tuples(st.just("rollback"), st.integers(0, 3))), max_size=60)


@given(operations)
def test_settling_follows_collect_acks(ops):
    unacked, model = Unacked(), {}  # model: tag -> delivery, any order
    next_tag, settled = 1, []
    for op in ops:
        if op[0] == "deliver":
            for _ in range(op[1]):
                unacked.add(next_tag, delivery(next_tag))
                model[next_tag] = delivery(next_tag)
                next_tag += 1
        elif op[0] == "settle":
            _, tag, multiple = op
            if multiple and tag == 0:
                expected = sorted(model)
            elif tag not in model:
                with pytest.raises(AMQPError) as error:
                    unacked.take(tag, multiple)
                assert error.value.code == spec.PRECONDITION_FAILED
                assert error.value.text.endswith(f"unknown delivery tag {tag}")
                continue
            else:
                expected = sorted(t for t in model if t <= tag) if multiple else [tag]
            taken = unacked.take(tag, multiple)
            assert [t for t, _ in taken] == expected
            assert all(d == model.pop(t) for t, d in taken)
            settled.append(taken)
        elif settled:  # a transaction rolled back: its settlements come back
            for taken in settled[-op[1]:]:
                unacked.restore(taken)
                model.update(taken)
            del settled[-op[1]:]
        assert len(unacked) == len(model)
    assert [t for t, _ in unacked.take_all()] == sorted(model)


def test_tags_of_a_holders_messages():
    unacked = Unacked()
    for tag, holder in [(1, 5), (2, 6), (3, 5)]:
        unacked.add(tag, delivery(tag, holder))
    assert unacked.tags_of(5, {10, 30, 99}) == {1, 3}
    assert unacked.get(2).holder == 6 and unacked.get(9) is None
