"""x-death bookkeeping and RabbitMQ's dead-letter cycle rule."""

from __future__ import annotations

import datetime

from warren.gateway.amqp.properties import BasicProperties
from warren.gateway.broker.deadletter import is_cycle, record_death

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.timezone.utc)


def test_first_death_sets_the_history_and_first_death_headers():
    props = BasicProperties(headers={"app": 1}, expiration="500")
    deaths = record_death(props, "work", "expired", "ex", "rk", NOW)
    assert deaths == [{"count": 1, "reason": "expired", "queue": "work", "time": NOW,
                       "exchange": "ex", "routing-keys": ["rk"], "original-expiration": "500"}]
    assert props.expiration is None
    assert props.headers["app"] == 1
    assert props.headers["x-first-death-queue"] == "work"
    assert props.headers["x-first-death-reason"] == "expired"
    assert props.headers["x-first-death-exchange"] == "ex"
    assert props.headers["x-last-death-queue"] == "work"


def test_repeated_death_counts_up_and_moves_to_the_front():
    props = BasicProperties()
    record_death(props, "work", "rejected", "", "work", NOW)
    record_death(props, "retry", "expired", "", "retry", NOW)
    deaths = record_death(props, "work", "rejected", "", "retry", NOW)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("work", "rejected", 2), ("retry", "expired", 1)]
    assert props.headers["x-first-death-queue"] == "work"
    assert props.headers["x-last-death-queue"] == "work"


def test_cycles():
    expired_a = {"queue": "a", "reason": "expired"}
    expired_b = {"queue": "b", "reason": "expired"}
    rejected_a = {"queue": "a", "reason": "rejected"}
    assert is_cycle("a", [expired_b, expired_a])  # a -> b -> a, all automatic
    assert not is_cycle("a", [expired_b, rejected_a])  # a consumer rejected it in a
    assert not is_cycle("c", [expired_b, expired_a])  # never died in c
    assert not is_cycle("a", [rejected_a])  # this death is a rejection
