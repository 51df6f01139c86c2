"""A shard's refusals in RabbitMQ's words: the shard speaks no AMQP, the gateway does."""

import pytest

from warren.gateway.amqp import spec
from warren.gateway.errors import refusal_error
from warren.shards.records import Refusal


@pytest.mark.parametrize("refused, code, text", [
    (Refusal.NO_QUEUE, spec.NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"),
    (Refusal.EXCLUSIVE_USE, spec.ACCESS_REFUSED,
     "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"),
    (Refusal.IN_USE, spec.PRECONDITION_FAILED, "PRECONDITION_FAILED - queue 'q' in vhost '/' in use"),
    (Refusal.NOT_EMPTY, spec.PRECONDITION_FAILED,
     "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty"),
    (Refusal.FAILED, spec.INTERNAL_ERROR, None),
    (Refusal.SHARD_DOWN, spec.NOT_FOUND,
     "NOT_FOUND - queue 'q' in vhost '/' has crashed and failed to restart"),
])
def test_each_refusal_in_rabbitmq_words(refused, code, text):
    error = refusal_error(refused, "/", "q")
    assert error.code == code
    assert text is None or error.text == text
