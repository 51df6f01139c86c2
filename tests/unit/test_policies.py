"""Policy selection and how policies combine with queue arguments (RabbitMQ's rules)."""

from __future__ import annotations

from warren.gateway.broker import policies
from warren.storage.metastore import PolicyDef


def policy(name, pattern, priority=0, apply_to="all", **definition) -> PolicyDef:
    return PolicyDef("/", name, pattern, apply_to, priority,
                     {k.replace("_", "-"): v for k, v in definition.items()})


def test_highest_priority_matching_policy_wins():
    ps = [policy("low", ".*", 0, message_ttl=1000), policy("high", "^orders", 5, max_length=10),
          policy("other", "^stock", 9, max_length=1)]
    assert policies.select(ps, "orders.eu", "queue").name == "high"
    assert policies.select(ps, "billing", "queue").name == "low"
    assert policies.select([], "q", "queue") is None


def test_equal_priorities_go_to_the_name_sorting_first():
    cases = [([policy("ab", ".*", 2), policy("a", ".*", 2), policy("low", ".*", 1)], "a"),
             ([policy("b", ".*"), policy("a", ".*"), policy("B", ".*")], "B")]
    for ps, expected in cases:  # whatever order they come in
        assert policies.select(ps, "q", "queue").name == expected
        assert policies.select(list(reversed(ps)), "q", "queue").name == expected


def test_apply_to_filters_by_kind_and_queue_type():
    ps = [policy("x", ".*", 1, "exchanges", alternate_exchange="ae"),
          policy("quorum", ".*", 2, "quorum_queues", delivery_limit=3),
          policy("classic", ".*", 0, "classic_queues", max_length=5)]
    assert policies.select(ps, "q", "queue", "classic").name == "classic"
    assert policies.select(ps, "q", "queue", "quorum").name == "quorum"
    assert policies.select(ps, "x", "exchange").name == "x"


def test_policy_and_arguments_combine_lower_limit_wins_argument_wins_otherwise():
    p = policy("p", ".*", message_ttl=5000, max_length=100, dead_letter_exchange="policy-dlx",
               expires=60000)
    declared = {"x-message-ttl": 1000, "x-max-length": 500, "x-dead-letter-exchange": "mine"}
    assert policies.queue_arguments(declared, p) == {
        "x-message-ttl": 1000, "x-max-length": 100, "x-dead-letter-exchange": "mine",
        "x-expires": 60000}
    assert policies.queue_arguments(declared, None) is declared


def test_invalid_policies_are_explained():
    assert policies.problems(policy("p", ".*", message_ttl=-1)) == \
        "invalid value for 'message-ttl': {value_negative,-1}"
    # RabbitMQ 3.10.8's words; a policy never sets the queue type there either
    assert policies.problems(policy("p", ".*", queue_type="quorum", zzz=5, max_length=3,
                                    aaa=[1, True])) == (
        'Validation failed\n\n[{<<"aaa">>,[1,true]},{<<"queue-type">>,<<"quorum">>},'
        '{<<"zzz">>,5}] are not recognised policy settings\n')
    assert policies.problems(policy("p", "(", max_length=1)).startswith("invalid pattern")
    assert policies.problems(policy("p", ".*", apply_to="nowhere", max_length=1)).startswith("apply-to")
    assert policies.problems(policy("p", ".*", consumer_timeout=500)) is None
