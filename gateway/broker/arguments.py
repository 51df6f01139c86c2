"""Queue and exchange declaration arguments: validation and equivalence, with
RabbitMQ's texts (`invalid arg ...`, `inequivalent arg ...`), as RabbitMQ 3.10
words them."""

from __future__ import annotations

import datetime
import decimal

from warren.shards.stream import parse_max_age

from ..amqp import spec
from ..errors import AMQPError

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_TYPES = ("classic", "quorum", "stream")
MAX_PRIORITY = 255


def type_name(value) -> str:
    """The field-table type RabbitMQ names in its texts."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(1 << 31) <= value < (1 << 31) else "long"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    return "array"


def _integer(minimum: int, maximum: int | None = None):
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f'"expected integer, got {type_name(value)}"'
        if value < minimum:
            return "{value_zero,0}" if value == 0 else f"{{value_negative,{value}}}"
        if maximum is not None and value > maximum:
            return f"{{max_value_exceeded,{value}}}"
        return None
    return check


def _string(value) -> str | None:
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{type_name(value)}}}"
    return None


def _one_of(choices: tuple[str, ...], error: str):
    """`error` words an unknown value, with {value} in it."""
    def check(value) -> str | None:
        if not isinstance(value, str):
            return f"{{unacceptable_type,{type_name(value)}}}"
        if value not in choices:
            return error.format(value=value)
        return None
    return check


def _max_age(value) -> str | None:
    if isinstance(value, bytes):
        return "{unacceptable_type,binary}"
    if not isinstance(value, str):
        return f"{{unacceptable_type,{type_name(value)}}}"
    return None if parse_max_age(value) is not None else "invalid_max_age"


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{type_name(value)}}}"


# Arguments RabbitMQ validates, and requires to be equal on redeclaration.
QUEUE_ARGUMENTS = {
    "x-expires": _integer(1),
    "x-message-ttl": _integer(0),
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-max-length": _integer(0),
    "x-max-length-bytes": _integer(0),
    "x-max-priority": _integer(0, MAX_PRIORITY),
    "x-overflow": _one_of(OVERFLOW_MODES, "invalid_overflow"),
    "x-queue-type": _one_of(QUEUE_TYPES, "\"unsupported queue type '{value}'\""),
    "x-queue-mode": _one_of(("default", "lazy"), "\"unsupported queue mode '{value}'\""),
    "x-single-active-consumer": _boolean,
    "x-consumer-timeout": _integer(1),
    "x-delivery-limit": _integer(-1),
    "x-max-age": _max_age,
    "x-stream-max-segment-size-bytes": _integer(0),
    "x-quorum-initial-group-size": _integer(1),  # capped at the nodes there are
    # The node a queue goes to in a cluster (cluster/members.py)
    "x-queue-leader-locator": _one_of(("client-local", "balanced"),
                                      "\"unsupported queue leader locator '{value}'\""),
    "x-queue-master-locator": _one_of(("client-local", "min-masters", "random"),
                                      "\"unsupported queue master locator '{value}'\""),
}
# Arguments each queue type refuses (RabbitMQ's capabilities), named in its texts.
STREAM_ONLY = ("x-max-age", "x-stream-max-segment-size-bytes")
UNSUPPORTED = {
    "classic": STREAM_ONLY + ("x-quorum-initial-group-size",),
    "quorum": STREAM_ONLY,
    "stream": ("x-expires", "x-message-ttl", "x-dead-letter-exchange",
               "x-dead-letter-routing-key", "x-max-length", "x-overflow", "x-max-priority",
               "x-single-active-consumer", "x-queue-mode", "x-delivery-limit",
               "x-max-in-memory-length", "x-max-in-memory-bytes",
               "x-quorum-initial-group-size"),
}
EXCHANGE_ARGUMENTS = {
    "alternate-exchange": _string,
}
# Exchange names among them: RabbitMQ words their wrong types differently.
_EXCHANGE_NAMES = ("x-dead-letter-exchange", "alternate-exchange")


def check_queue_type(arguments: dict, durable: bool, exclusive: bool, auto_delete: bool,
                     what: str) -> None:
    """Quorum queues and streams are durable, neither exclusive nor auto-delete,
    and each type refuses the arguments it has no use for (RabbitMQ's refusals,
    in its order: for a stream, the arguments' values, those it refuses in the
    order declared, then its properties)."""
    kind = arguments.get("x-queue-type", "classic")
    if kind == "stream":
        validate(arguments, QUEUE_ARGUMENTS, what)
    if kind not in ("quorum", "stream"):
        return
    refusals = ((auto_delete, True, "auto-delete"), (exclusive, True, "exclusive-owner"),
                (durable, False, "non-durable"))
    for flag, value, name in refusals:
        if flag == value:
            raise AMQPError(spec.PRECONDITION_FAILED, f"invalid property '{name}' for {what}")


def _refuse_unsupported(arguments: dict, kind: str, what: str) -> None:
    refused = UNSUPPORTED.get(kind, ())
    for name in arguments:
        if name in refused:
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"invalid arg '{name}' for {what} of queue type rabbit_{kind}_queue")


def exchange_named(arguments: dict, name: str, what: str) -> str | None:
    """The exchange an argument names (x-dead-letter-exchange, alternate-exchange),
    None without one; 406 when it is no string."""
    value = arguments.get(name)
    if value is None and name not in arguments:
        return None
    if not isinstance(value, (str, bytes)):
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"invalid type '{type_name(value)}' for arg '{name}' in {what}")
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def validate(arguments: dict, known: dict, what: str) -> None:
    for name, check in known.items():
        if name not in arguments:
            continue
        if name in _EXCHANGE_NAMES:
            exchange_named(arguments, name, what)
        value = arguments[name]
        error = check(value)
        if error:
            raise AMQPError(spec.PRECONDITION_FAILED, f"invalid arg '{name}' for {what}: {error}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"invalid arg 'x-dead-letter-routing-key' for {what}: "
                        "routing_key_but_no_dlx_defined")
    if known is QUEUE_ARGUMENTS:
        _refuse_unsupported(arguments, arguments.get("x-queue-type", "classic"), what)


def assert_equivalent(received: dict, current: dict, known: dict, what: str) -> None:
    """406 when a redeclaration changes an argument RabbitMQ compares."""
    for name in known:
        new, old = received.get(name, _ABSENT), current.get(name, _ABSENT)
        if new is _ABSENT and old is _ABSENT:
            continue
        if new is _ABSENT or old is _ABSENT or new != old or type_name(new) != type_name(old):
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"inequivalent arg '{name}' for {what}: received {_describe(new)} "
                            f"but current is {_describe(old)}")


_ABSENT = object()


def _describe(value) -> str:
    if value is _ABSENT:
        return "none"
    shown = str(value).lower() if isinstance(value, bool) else (
        value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return f"the value '{shown}' of type '{type_name(value)}'"
