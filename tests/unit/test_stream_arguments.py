"""Stream queues' declaration rules, policy keys and x-stream-offset, as
RabbitMQ 3.10.8 answers them (each text checked against it with pika)."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.broker import arguments, policies
from warren.gateway.errors import AMQPError
from warren.gateway.session.consuming import stream_start
from warren.storage.metastore import PolicyDef

WHAT = "queue 's' in vhost '/'"
STREAM = {"x-queue-type": "stream"}


def refusal(args: dict, durable=True, exclusive=False, auto_delete=False) -> str | None:
    try:
        arguments.check_queue_type(args, durable, exclusive, auto_delete, WHAT)
        arguments.validate(args, arguments.QUEUE_ARGUMENTS, WHAT)
    except AMQPError as error:
        return f"{error.code} {error.text}"
    return None


@given(st.integers(1, 10**6), st.sampled_from("YMDhms"))
def test_max_age_counts_its_unit(count, unit):
    ms = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
          "m": 60_000, "s": 1000}[unit]
    assert arguments.parse_max_age(f"{count}{unit}") == count * ms
    assert refusal({**STREAM, "x-max-age": f"{count}{unit}"}) is None


@pytest.mark.parametrize("age", ["0s", "1d", "10S", "1.5h", "1X", "", " 10s", "s", "10"])
def test_a_bad_max_age_is_refused(age):
    assert arguments.parse_max_age(age) is None
    assert refusal({**STREAM, "x-max-age": age}) == (
        f"406 PRECONDITION_FAILED - invalid arg 'x-max-age' for {WHAT}: invalid_max_age")


@pytest.mark.parametrize("value, text", [
    (5, "{unacceptable_type,signedint}"), (b"10s", "{unacceptable_type,binary}")])
def test_a_max_age_of_another_type_is_refused(value, text):
    assert refusal({**STREAM, "x-max-age": value}) == (
        f"406 PRECONDITION_FAILED - invalid arg 'x-max-age' for {WHAT}: {text}")


@pytest.mark.parametrize("value, text", [
    ("a", '"expected integer, got longstr"'), (-5, "{value_negative,-5}")])
def test_segment_size_is_a_long(value, text):
    assert refusal({**STREAM, "x-stream-max-segment-size-bytes": 0}) is None
    assert refusal({**STREAM, "x-stream-max-segment-size-bytes": value}) == (
        "406 PRECONDITION_FAILED - invalid arg 'x-stream-max-segment-size-bytes' for "
        f"{WHAT}: {text}")


@pytest.mark.parametrize("flags, name", [
    (dict(durable=False), "non-durable"), (dict(exclusive=True), "exclusive-owner"),
    (dict(auto_delete=True), "auto-delete"),
    (dict(durable=False, exclusive=True, auto_delete=True), "auto-delete")])
def test_a_stream_is_durable_only(flags, name):
    assert refusal(STREAM, **{"durable": True, **flags}) == (
        f"406 PRECONDITION_FAILED - invalid property '{name}' for {WHAT}")


@pytest.mark.parametrize("args, name", [
    ({"x-message-ttl": 1000}, "x-message-ttl"), ({"x-max-length": 10}, "x-max-length"),
    ({"x-queue-mode": "lazy", "x-max-priority": 5}, "x-queue-mode"),
    ({"x-single-active-consumer": True, "x-expires": 5}, "x-single-active-consumer"),
    ({"x-dead-letter-exchange": "x"}, "x-dead-letter-exchange"),
    ({"x-overflow": "drop-head"}, "x-overflow"), ({"x-delivery-limit": 3}, "x-delivery-limit")])
def test_a_stream_refuses_the_first_argument_it_has_no_use_for(args, name):
    # before its properties; a bad value before either
    assert refusal({**STREAM, **args}, durable=False) == (
        f"406 PRECONDITION_FAILED - invalid arg '{name}' for {WHAT} of queue type "
        "rabbit_stream_queue")
    assert refusal({**STREAM, **args, "x-max-age": "1X"}, durable=False) == (
        f"406 PRECONDITION_FAILED - invalid arg 'x-max-age' for {WHAT}: invalid_max_age")


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_other_queues_refuse_stream_arguments(kind):
    for name, value in (("x-max-age", "1D"), ("x-stream-max-segment-size-bytes", 5)):
        assert refusal({"x-queue-type": kind, name: value}) == (
            f"406 PRECONDITION_FAILED - invalid arg '{name}' for {WHAT} of queue type "
            f"rabbit_{kind}_queue")


def test_a_stream_takes_its_retention_and_a_consumer_timeout():
    assert refusal({**STREAM, "x-max-age": "7D", "x-max-length-bytes": 1000,
                    "x-stream-max-segment-size-bytes": 500, "x-consumer-timeout": 1000}) is None


def policy(apply_to="all", **definition) -> PolicyDef:
    return PolicyDef("/", "p", ".*", apply_to, 0,
                     {k.replace("_", "-"): v for k, v in definition.items()})


def test_stream_policy_keys_apply_the_lower_value():
    assert policies.problems(policy(max_age="10s", stream_max_segment_size_bytes=100,
                                    max_length_bytes=5)) is None
    assert policies.problems(policy(max_age="1X")) == "invalid value for 'max-age': invalid_max_age"
    effective = policies.queue_arguments(
        {**STREAM, "x-max-age": "1h", "x-stream-max-segment-size-bytes": 50},
        policy(max_age="10m", stream_max_segment_size_bytes=100, max_length_bytes=7))
    assert effective["x-max-age"] == "10m"
    assert effective["x-stream-max-segment-size-bytes"] == 50
    assert effective["x-max-length-bytes"] == 7
    assert policies.queue_arguments({**STREAM, "x-max-age": "1m"},
                                    policy(max_age="1D"))["x-max-age"] == "1m"


def test_a_streams_policy_applies_to_streams_only():
    streams = policy("streams", max_age="1D")
    assert policies.problems(streams) is None
    assert policies.select([streams], "s", "queue", "stream") is streams
    assert policies.select([streams], "s", "queue", "classic") is None
    assert policies.select([policy("classic_queues")], "s", "queue", "stream") is None


@pytest.mark.parametrize("value, start", [
    ("first", ("first", 0)), (b"last", ("last", 0)), ("next", ("next", 0)), (7, ("offset", 7)),
    (-1, ("offset", 0)), (1 << 40, ("offset", 1 << 40)),
    (datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), ("timestamp", 1577836800000))])
def test_stream_offsets(value, start):
    assert stream_start(value) == start


@pytest.mark.parametrize("value", ["bogus", True, {"a": 1}, [1], 1.5, None])
def test_a_stream_offset_of_another_kind_is_rabbitmqs_internal_error(value):
    with pytest.raises(AMQPError) as raised:
        stream_start(value)
    assert (raised.value.code, raised.value.text, raised.value.hard) == (
        541, "INTERNAL_ERROR", True)
