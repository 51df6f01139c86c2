"""The charts' server-side history (gateway/management/history.py), in-process:
RabbitMQ's range parameters, the samples' shape, and that each sample is the value
last recorded at or before its time, whatever the recording times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.management.history import (
    KEPT_AGE,
    KEPT_INCR,
    MAX_SAMPLES,
    History,
    add_samples,
    details,
    kept_values,
    sample_range,
)

T0 = 1_795_000_000.0  # a wall-clock time on a KEPT_INCR boundary


@pytest.mark.parametrize("query, expected", [
    ({"lengths_age": "60", "lengths_incr": "5"}, (60, 5)),
    ({"lengths_age": "2500", "lengths_incr": "5"}, (2500, 5)),  # 500 increments: the most
    ({"lengths_age": "60"}, None),  # RabbitMQ ignores a range without both
    ({"lengths_age": "abc", "lengths_incr": "5"}, None),
    ({"lengths_age": "5.5", "lengths_incr": "5"}, None),
    ({}, None)])
def test_a_range_is_taken_or_ignored_as_rabbitmq_does(query, expected):
    assert sample_range(query, "lengths") == expected


@pytest.mark.parametrize("age, incr", [(60, 0), (0, 5), (-5, 5), (2505, 5), (100000, 1)])
def test_a_range_rabbitmq_refuses_is_refused_in_its_words(age, incr):
    with pytest.raises(ValueError) as error:
        sample_range({"msg_rates_age": str(age), "msg_rates_incr": str(incr)}, "msg_rates")
    assert str(error.value) == f"Invalid range parameters: age {age}, incr {incr}"


def test_samples_are_newest_first_with_the_current_value_and_rabbitmqs_averages():
    history = History()
    for second in range(0, 31):  # one message a second into a queue
        history.record(T0 + second, {"q": {"ready": second}})
    now = T0 + 30.5
    samples = history.samples(["q"], now, 30, 5, {"ready": 31})["ready"]
    assert [s["timestamp"] for s in samples] == [int((T0 + 35 - 5 * i) * 1000) for i in range(7)]
    assert [s["sample"] for s in samples] == [31, 30, 25, 20, 15, 10, 5]
    shown = details(0.6, samples, 5)
    assert shown["avg_rate"] == pytest.approx((31 - 5) / 30)
    assert shown["avg"] == pytest.approx(sum([31, 30, 25, 20, 15, 10, 5]) / 7)
    assert shown["rate"] == 0.6


def test_before_its_history_a_key_repeats_its_oldest_value_and_forgotten_keys_go():
    history = History()
    history.record(T0 + 100, {"a": {"n": 7}, "b": {"n": 1}})
    samples = history.samples(["a"], T0 + 100, 50, 10, {"n": 8})["n"]
    assert [s["sample"] for s in samples] == [8, 7, 7, 7, 7, 7]
    history.record(T0 + 101, {"a": {"n": 9}})
    assert history.samples(["b"], T0 + 101, 10, 5, {"n": 0})["n"][1:] == [
        {"sample": 0, "timestamp": int((T0 + 100) * 1000)},
        {"sample": 0, "timestamp": int((T0 + 95) * 1000)}]


def test_a_key_new_since_the_first_record_had_zeros_before_as_a_queue_declared_since():
    history = History()
    history.record(T0 + 1, {"old": {"n": 5}})
    history.record(T0 + 12, {"old": {"n": 5}, "new": {"n": 30}})
    assert [s["sample"] for s in history.samples(["new"], T0 + 21, 20, 5, {"n": 31})["n"]] == [
        31, 30, 30, 0, 0]
    assert [s["sample"] for s in history.samples(["old"], T0 + 21, 20, 5, {"n": 5})["n"]] == [
        5] * 5


def test_an_idle_key_keeps_one_entry_and_a_busy_one_no_more_than_its_age():
    history = History()
    for second in range(3 * int(KEPT_AGE)):
        history.record(T0 + second, {"idle": {"n": 0}, "busy": {"n": second}})
    assert history.entries("idle") == 1
    assert history.entries("busy") <= KEPT_AGE / KEPT_INCR + 2


def test_samples_sum_over_keys_and_lengths_and_stats_get_their_details():
    history = History()
    history.record(T0, {"q1": {"ready": 1, "unacked": 2, "published": 10},
                        "q2": {"ready": 3, "unacked": 0, "published": 5}})
    lengths = {"messages": 9, "messages_ready": 6, "messages_unacknowledged": 3}
    stats = {"publish": 20, "publish_details": {"rate": 1.5}}
    add_samples({"lengths_age": "10", "lengths_incr": "5", "msg_rates_age": "10",
                 "msg_rates_incr": "5"}, history, ["q1", "q2"], T0 + 1, lengths, stats,
                [("publish", "published"), ("ack", "acked")])
    assert [s["sample"] for s in lengths["messages_ready_details"]["samples"]] == [6, 4, 4]
    assert [s["sample"] for s in lengths["messages_details"]["samples"]] == [9, 6, 6]
    assert [s["sample"] for s in stats["publish_details"]["samples"]] == [20, 15, 15]
    assert stats["publish_details"]["rate"] == 1.5 and "ack_details" not in stats


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 20), st.integers(0, 1000)), min_size=1, max_size=80),
       st.integers(1, 30), st.integers(1, 60))
def test_each_sample_is_the_value_last_recorded_by_a_kept_boundary_at_or_before_it(
        steps, incr, count):
    history = History()
    recorded, now = [], T0
    for gap, value in steps:
        now += gap
        history.record(now, {"k": {"n": value}})
        recorded.append((now, value))
    samples = history.samples(["k"], now, incr * count, incr, {"n": -1})["n"]
    assert len(samples) == count + 1 and samples[0]["sample"] == -1
    for s in samples[1:]:
        t = s["timestamp"] / 1000
        # entries sit on KEPT_INCR boundaries: the last value recorded by the last
        # boundary at or before t; before the first record, the first value
        boundary = (t // KEPT_INCR) * KEPT_INCR
        before = [v for when, v in recorded if when <= boundary + 1e-6]
        if t < now - KEPT_AGE - KEPT_INCR:
            continue  # beyond the kept age: the oldest kept value, tested above
        assert s["sample"] == (before[-1] if before else recorded[0][1]), (t, recorded)


def test_at_most_max_samples_plus_one():
    history = History()
    assert len(history.samples([], T0, MAX_SAMPLES * 5, 5, {"n": 0})["n"]) == MAX_SAMPLES + 1


def test_a_sampler_each_second_records_near_each_boundary_only():
    history = History()
    recorded = []
    for tenth in range(0, 300, 10):  # a sample a second for 30 s
        now = T0 + 0.3 + tenth / 10
        if history.due(now, 1.0):
            history.record(now, {"k": {"n": tenth}})
            recorded.append(round(now - T0, 1))
    # the first sample, then the last before each boundary
    assert recorded == [0.3, 4.3, 9.3, 14.3, 19.3, 24.3, 29.3]


def test_kept_values_are_each_queues_their_sums_per_vhost_and_the_totals():
    figure = dict(published=5, delivered=4, redelivered=1, acked=3, ready=2, unacked=1,
                  consumers=9)
    kept = kept_values({1: figure, 2: {**figure, "ready": 10}, 3: figure},
                       {"received": 20}, {1: "/", 2: "/", 3: "team"})
    assert kept[("queue", 2)] == dict(published=5, delivered=4, redelivered=1, acked=3,
                                      ready=10, unacked=1)
    assert kept[("vhost", "/")] == dict(published=10, delivered=8, redelivered=2, acked=6,
                                        ready=12, unacked=2)
    assert kept[("vhost", "team")]["ready"] == 2
    assert kept["totals"] == {"received": 20, "ready": 14, "unacked": 3}
