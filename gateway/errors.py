"""AMQP errors raised by handlers: soft ones close a channel, hard ones the connection.

Texts follow RabbitMQ: '<REPLY NAME> - <detail>', so client libraries show
the same messages users know from RabbitMQ.
"""

from __future__ import annotations

from warren.shards.records import Refusal

from .amqp import spec


class AMQPError(Exception):
    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0):
        self.code = code
        self.detail = detail
        self.text = f"{spec.REPLY_NAMES[code]} - {detail}"
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)

    @property
    def hard(self) -> bool:
        return self.code in spec.HARD_ERRORS


def queue_name(vhost: str, name: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def exchange_name(vhost: str, name: str) -> str:
    return f"exchange '{name}' in vhost '{vhost}'"


def home_node_down(node: str, vhost: str, queue: str) -> AMQPError:
    """A queue of a cluster's node that is down or out of reach: RabbitMQ's 404
    for any command on it (a declaration with other arguments too)."""
    return AMQPError(spec.NOT_FOUND, f"home node '{node}' of durable queue '{queue}' in vhost "
                     f"'{vhost}' is down or inaccessible")


def refusal_error(refused: int, vhost: str, queue: str) -> AMQPError:
    """A shard's refusal (shards.records.Refusal) in RabbitMQ's words."""
    what = queue_name(vhost, queue)
    if refused == Refusal.NO_QUEUE:
        return AMQPError(spec.NOT_FOUND, f"no {what}")
    if refused == Refusal.EXCLUSIVE_USE:
        return AMQPError(spec.ACCESS_REFUSED, f"{what} in exclusive use")
    if refused == Refusal.IN_USE:
        return AMQPError(spec.PRECONDITION_FAILED, f"{what} in use")
    if refused == Refusal.NOT_EMPTY:
        return AMQPError(spec.PRECONDITION_FAILED, f"{what} not empty")
    if refused == Refusal.SHARD_DOWN:
        # Its shard died and is not back yet: RabbitMQ's answer for a queue whose
        # process crashed, a channel error (the connection's other channels go on).
        return AMQPError(spec.NOT_FOUND, f"{what} has crashed and failed to restart")
    return AMQPError(spec.INTERNAL_ERROR, f"the shard of {what} failed to handle it")
