"""Publishing and getting messages through the API, as RabbitMQ's management
plugin does: over an internal connection (gateway/internal.py), so a message
goes through the same channel code as one from a client, with the user's
permissions, routing, confirms and the shards.

POST /api/exchanges/{vhost}/{name}/publish  {"properties", "routing_key", "payload",
    "payload_encoding": "string"|"base64"} -> {"routed": bool}
POST /api/queues/{vhost}/{name}/get  {"count", "ackmode": "ack_requeue_true"|
    "ack_requeue_false"|"reject_requeue_true"|"reject_requeue_false",
    "encoding": "auto"|"base64", "truncate"} -> [message, ...]
"""

from __future__ import annotations

import base64
import binascii
import re

from ..amqp import methods as m
from ..amqp import spec
from ..amqp.properties import (
    BasicProperties,
    PropertiesError,
    decode_properties,
    encode_properties,
)
from ..errors import AMQPError
from ..session.direct import InternalConnection
from .http import HTTPError, Request, Response, bad_request, check_name, check_types
from .shapes import jsonable

PROPERTY_TYPES = {"content_type": str, "content_encoding": str, "headers": dict,
                  "delivery_mode": int, "priority": int, "correlation_id": str,
                  "reply_to": str, "expiration": str, "message_id": str, "timestamp": int,
                  "type": str, "user_id": str, "app_id": str, "cluster_id": str}
ACKMODES = {  # ackmode -> (no_ack on basic.get, how the messages got are settled)
    "ack_requeue_false": (True, None),
    "ack_requeue_true": (False, m.BasicNack),  # requeued, not counted as failed
    "reject_requeue_true": (False, m.BasicReject),
    "reject_requeue_false": (False, m.BasicReject),
}


def _required(body: dict, *names: str) -> None:
    missing = [name for name in names if name not in body]
    if missing:  # RabbitMQ's wording
        raise bad_request("[" + ",".join(f"{{key_missing,{name}}}" for name in missing) + "]")


def _integer(body: dict, name: str) -> int | None:
    """An integer field, or its decimal string as rabbitmqadmin sends it (RabbitMQ
    takes both, and answers anything else as below)."""
    value = body.get(name)
    if isinstance(value, str):
        if not re.fullmatch(r"-?[0-9]{1,19}", value):
            raise HTTPError(400, "bad_request", ["not_integer", value[:255]])
        return int(value)
    return value


def _http_error(error: AMQPError) -> HTTPError:
    if error.code == spec.NOT_FOUND:
        return HTTPError(404, "not_found", error.text)
    if error.code == spec.ACCESS_REFUSED:
        return HTTPError(401, "not_authorised", error.text)
    return bad_request(error.text)


async def publish(gateway, request: Request, vhost, exchange: str) -> Response:
    body = request.json({"properties": dict, "routing_key": str, "payload": str,
                         "payload_encoding": str, "mandatory": bool})
    _required(body, "properties", "routing_key", "payload", "payload_encoding")
    # RabbitMQ routes a longer key it is given here; an AMQP publish cannot carry one
    check_name("exchange", exchange)
    check_name("routing_key", body["routing_key"])
    properties = body["properties"]
    check_types(properties, PROPERTY_TYPES, "properties.")
    unknown = sorted(set(properties) - set(PROPERTY_TYPES))
    if unknown:
        raise bad_request(f"unknown properties: {', '.join(unknown)}")
    encoding = body["payload_encoding"]
    if encoding == "string":
        payload = body["payload"].encode()
    elif encoding == "base64":
        try:
            payload = base64.b64decode(body["payload"], validate=True)
        except binascii.Error:
            raise bad_request("payload is not valid base64") from None
    else:
        raise bad_request(f"payload_encoding must be string or base64, not '{encoding}'")
    try:
        raw = encode_properties(BasicProperties(**properties))
    except (PropertiesError, TypeError, ValueError, OverflowError) as error:
        raise bad_request(f"invalid properties: {error}") from None
    conn = InternalConnection(gateway, request.user.name, vhost)
    try:
        conn.run(m.ConfirmSelect())
        conn.run(m.BasicPublish(exchange="" if exchange == "amq.default" else exchange,
                                routing_key=body["routing_key"], mandatory=True), raw, payload)
        # mandatory: a message that reaches no queue comes back before its confirm
        answer, _, _ = await conn.wait_for(lambda method: type(method) in (m.BasicAck,
                                                                            m.BasicNack))
        returned = any(type(method) is m.BasicReturn for method, _, _ in conn.replies)
        return Response.json({"routed": type(answer) is m.BasicAck and not returned})
    except AMQPError as error:
        raise _http_error(error) from None
    finally:
        conn.close()


async def get(gateway, request: Request, vhost, queue: str) -> Response:
    body = request.json({"count": (int, str), "ackmode": str, "encoding": str,
                         "truncate": (int, str)})
    _required(body, "count", "ackmode", "encoding")
    count, truncate = _integer(body, "count"), _integer(body, "truncate")
    check_name("queue", queue)
    if body["ackmode"] not in ACKMODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
    if body["encoding"] not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    no_ack, settle = ACKMODES[body["ackmode"]]
    requeue = body["ackmode"] != "reject_requeue_false"
    conn = InternalConnection(gateway, request.user.name, vhost)
    messages = []
    try:
        # every message is got before any is settled, so a requeued one is not got again
        for _ in range(max(count, 0)):
            conn.run(m.BasicGet(queue=queue, no_ack=no_ack))
            method, properties, payload = await conn.wait_for(
                lambda method: type(method) in (m.BasicGetOk, m.BasicGetEmpty))
            if type(method) is m.BasicGetEmpty:
                break
            messages.append(_message(method, properties, payload, body["encoding"], truncate))
            last_tag = method.delivery_tag
        if messages and settle is m.BasicNack:
            conn.run(m.BasicNack(delivery_tag=last_tag, multiple=True, requeue=True))
        elif messages and settle is m.BasicReject:
            for tag in range(1, last_tag + 1):
                conn.run(m.BasicReject(delivery_tag=tag, requeue=requeue))
        if conn.error is not None:
            raise conn.error
        return Response.json(messages)
    except AMQPError as error:
        raise _http_error(error) from None
    finally:
        conn.close()


def _message(method: m.BasicGetOk, properties: bytes, payload: bytes, encoding: str,
             truncate: int | None) -> dict:
    try:
        props = decode_properties(properties)
        shown = {name: jsonable(getattr(props, name)) for name in props.FIELDS
                 if getattr(props, name) is not None}
    except PropertiesError:
        shown = {}
    size = len(payload)
    if truncate is not None and truncate >= 0:
        payload = payload[:truncate]
    text = None
    if encoding == "auto":
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"payload_bytes": size, "redelivered": method.redelivered,
            "exchange": method.exchange, "routing_key": method.routing_key,
            "message_count": method.message_count, "properties": shown,
            "payload": text if text is not None else base64.b64encode(payload).decode(),
            "payload_encoding": "string" if text is not None else "base64"}
