"""Policies: queue and exchange settings applied by name pattern, as RabbitMQ
applies them. For each queue or exchange the matching policy of the highest
priority wins (one policy, never a merge of several; ties: see select); its keys
then combine with the declared arguments: for limits the lower value wins, for
the rest the declared argument wins."""

from __future__ import annotations

from warren.storage.metastore import PolicyDef

from . import arguments, patterns

# policy key -> the queue argument it stands for
QUEUE_KEYS = {
    "message-ttl": "x-message-ttl",
    "expires": "x-expires",
    "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    "consumer-timeout": "x-consumer-timeout",
    "delivery-limit": "x-delivery-limit",
    "max-age": "x-max-age",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
}
LOWER_WINS = {"message-ttl", "expires", "max-length", "max-length-bytes", "consumer-timeout",
              "delivery-limit", "stream-max-segment-size-bytes"}
EXCHANGE_KEYS = {"alternate-exchange": "alternate-exchange"}
APPLY_TO = ("all", "queues", "classic_queues", "quorum_queues", "streams", "exchanges")
_CHECKS = {**arguments.QUEUE_ARGUMENTS, **arguments.EXCHANGE_ARGUMENTS}


def problems(policy: PolicyDef) -> str | None:
    """Why a policy cannot be set, or None."""
    if policy.apply_to not in APPLY_TO:
        return f"apply-to must be one of {', '.join(APPLY_TO)}"
    pattern = patterns.problem(policy.pattern)
    if pattern:
        return f"invalid pattern '{policy.pattern}': {pattern}"
    if not isinstance(policy.definition, dict) or not policy.definition:
        return "definition must be a non-empty object"
    unknown = sorted((key, value) for key, value in policy.definition.items()
                     if key not in QUEUE_KEYS and key not in EXCHANGE_KEYS)
    if unknown:  # `queue-type` among them: a policy never sets a queue's type
        settings = ",".join(f"{{{_erlang(key)},{_erlang(value)}}}" for key, value in unknown)
        return f"Validation failed\n\n[{settings}] are not recognised policy settings\n"
    for key, value in policy.definition.items():
        argument = QUEUE_KEYS.get(key) or EXCHANGE_KEYS[key]
        error = _CHECKS[argument](value)
        if error:
            return f"invalid value for '{key}': {error}"
    return None


def _erlang(value) -> str:
    """A JSON value as RabbitMQ's texts print it (an Erlang term)."""
    if isinstance(value, str):
        return '<<"%s">>' % value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_erlang(item) for item in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{_erlang(k)} => {_erlang(v)}" for k, v in value.items()) + "}"
    return repr(value)


def exchanges_named(definition: dict) -> list[str]:
    """The exchanges a policy's definition sends messages to: its dead-letter and
    alternate exchanges."""
    return [value for key in ("dead-letter-exchange", "alternate-exchange")
            if isinstance(value := definition.get(key), str)]


def _applies(apply_to: str, kind: str, queue_type: str) -> bool:
    if kind == "exchange":
        return apply_to in ("all", "exchanges")
    if queue_type == "stream":
        return apply_to in ("all", "queues", "streams")
    return apply_to in ("all", "queues") or apply_to == f"{queue_type}_queues"


def select(policies, name: str, kind: str, queue_type: str = "classic") -> PolicyDef | None:
    """The policy for a queue or exchange: the highest priority of those whose
    pattern matches the name; of equal priorities, the name sorting first (in code
    points). RabbitMQ leaves that tie undefined (README, Policies)."""
    matching = [policy for policy in policies if _applies(policy.apply_to, kind, queue_type)
                and patterns.search(policy.pattern, name)]
    return min(matching, key=lambda policy: (-policy.priority, policy.name), default=None)


def queue_arguments(declared: dict, policy: PolicyDef | None) -> dict:
    """The arguments a queue runs with: its own, combined with its policy's."""
    if policy is None:
        return declared
    effective = dict(declared)
    for key, value in policy.definition.items():
        argument = QUEUE_KEYS.get(key)
        if argument is None:
            continue
        if argument not in declared:
            effective[argument] = value
        elif key in LOWER_WINS:
            effective[argument] = min(declared[argument], value)
        elif key == "max-age":  # the shorter age wins, as RabbitMQ's streams take it
            effective[argument] = min(declared[argument], value,
                                      key=lambda age: arguments.parse_max_age(age) or 0)
    return effective


def exchange_alternate(declared: dict, policy: PolicyDef | None) -> str | None:
    value = declared.get("alternate-exchange")
    if value is None and policy is not None:
        value = policy.definition.get("alternate-exchange")
    return value if isinstance(value, str) and value else None
