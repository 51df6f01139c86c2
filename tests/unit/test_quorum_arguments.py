"""x-quorum-initial-group-size, as RabbitMQ 3.10.8 answers it (each text checked
against a three-node cluster with pika): a positive integer, on quorum queues only,
compared at a redeclaration like any other argument."""

from __future__ import annotations

import pytest

from warren.gateway.broker import arguments
from warren.gateway.errors import AMQPError

WHAT = "queue 'q' in vhost '/'"
SIZE = "x-quorum-initial-group-size"


def refusal(args: dict) -> str | None:
    try:
        arguments.validate(args, arguments.QUEUE_ARGUMENTS, WHAT)
    except AMQPError as error:
        return f"{error.code} {error.text}"
    return None


@pytest.mark.parametrize("value, error", [
    (0, "{value_zero,0}"), (-1, "{value_negative,-1}"),
    ("3", '"expected integer, got longstr"'), (True, '"expected integer, got bool"')])
def test_a_group_size_is_a_positive_integer(value, error):
    assert refusal({"x-queue-type": "quorum", SIZE: value}) == (
        f"406 PRECONDITION_FAILED - invalid arg '{SIZE}' for {WHAT}: {error}")


@pytest.mark.parametrize("value", [1, 2, 3, 5])
def test_any_positive_size_is_taken(value):
    assert refusal({"x-queue-type": "quorum", SIZE: value}) is None


def test_a_classic_queue_refuses_a_group_size():
    assert refusal({SIZE: 3}) == (f"406 PRECONDITION_FAILED - invalid arg '{SIZE}' for {WHAT} "
                                  "of queue type rabbit_classic_queue")


def test_a_redeclaration_compares_the_declared_size():
    with pytest.raises(AMQPError) as refused:
        arguments.assert_equivalent({SIZE: 3}, {SIZE: 2}, arguments.QUEUE_ARGUMENTS, WHAT)
    assert refused.value.text == (f"PRECONDITION_FAILED - inequivalent arg '{SIZE}' for {WHAT}: received the value "
                                  "'3' of type 'signedint' but current is the value '2' of "
                                  "type 'signedint'")
