"""AMQP errors raised by handlers: soft ones close a channel, hard ones the connection.

Texts follow RabbitMQ: '<REPLY NAME> - <detail>', so client libraries show
the same messages users know from RabbitMQ.
"""

from __future__ import annotations

from .amqp import spec


class AMQPError(Exception):
    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0):
        self.code = code
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
