"""Locust users that speak AMQP 0-9-1 (pika BlockingConnection, one per user; pika's
blocking adapter uses plain sockets and select, which gevent's monkey-patching
makes cooperative).

    python -m locust -f loadtest/locustfile.py --host amqp://guest:guest@127.0.0.1:5672/%2F
    python -m locust -f loadtest/locustfile.py --headless -u 20 -r 5 -t 60s \\
        --host amqp://guest:guest@127.0.0.1:5672/%2F --csv /tmp/warren --only-summary

Every operation is reported to Locust's statistics (request_type "amqp"), so the
web UI and the --csv files show rates and response-time percentiles:

* "publish+confirm": a persistent message into a durable work queue, on a channel
  in confirm mode (basic_publish returns once the broker confirmed it);
* "get+ack": basic.get from the work queue and ack ("get-empty" when it was empty);
* "rpc direct-reply-to": RabbitMQ's direct reply-to: the user consumes from the
  pseudo-queue amq.rabbitmq.reply-to (no-ack), publishes a request to a server
  queue with reply_to=amq.rabbitmq.reply-to, and waits for the answer of a
  responder (one greenlet per Locust process, its own connection) that publishes
  the reply to the request's reply_to through the default exchange.

Environment variables:
  WARREN_LOCUST_PUBLISH, WARREN_LOCUST_CONSUME, WARREN_LOCUST_RPC
                          task weights (default 3, 3, 1); 0 disables a task, e.g.
                          WARREN_LOCUST_RPC=0 on a broker without direct reply-to
  WARREN_LOCUST_BODY      body bytes (default 100)
  WARREN_LOCUST_QUEUE     work queue name (default warren-locust-work)
  WARREN_LOCUST_RPC_QUEUE RPC server queue name (default warren-locust-rpc)
  WARREN_LOCUST_WAIT      seconds between a user's tasks (default 0)
  WARREN_LOCUST_TIMEOUT   RPC reply timeout in seconds (default 5)
  WARREN_LOCUST_CLEANUP   1 (default): delete both queues when the test stops
"""

from __future__ import annotations

import logging
import os
import time
import uuid

import pika
import pika.exceptions
from locust import User, constant, events, task
from locust.runners import MasterRunner

PUBLISH_WEIGHT = int(os.environ.get("WARREN_LOCUST_PUBLISH", "3"))
CONSUME_WEIGHT = int(os.environ.get("WARREN_LOCUST_CONSUME", "3"))
RPC_WEIGHT = int(os.environ.get("WARREN_LOCUST_RPC", "1"))
BODY = b"x" * int(os.environ.get("WARREN_LOCUST_BODY", "100"))
WORK_QUEUE = os.environ.get("WARREN_LOCUST_QUEUE", "warren-locust-work")
RPC_QUEUE = os.environ.get("WARREN_LOCUST_RPC_QUEUE", "warren-locust-rpc")
WAIT = float(os.environ.get("WARREN_LOCUST_WAIT", "0"))
RPC_TIMEOUT = float(os.environ.get("WARREN_LOCUST_TIMEOUT", "5"))
CLEANUP = os.environ.get("WARREN_LOCUST_CLEANUP", "1") == "1"

REPLY_TO = "amq.rabbitmq.reply-to"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _parameters(url: str | None) -> pika.URLParameters:
    parameters = pika.URLParameters(url or DEFAULT_URL)
    parameters.heartbeat = 0  # a blocked greenlet must not miss heartbeats
    parameters.blocked_connection_timeout = 30
    parameters.socket_timeout = 10
    return parameters


@events.init.add_listener
def _quiet_pika(**_kwargs) -> None:
    # pika logs every connection open and close at INFO.
    logging.getLogger("pika").setLevel(logging.WARNING)


class RpcTimeout(Exception):
    pass


# --- the RPC responder: one greenlet per Locust process ------------------------------------


class Responder:
    """Consumes RPC_QUEUE and answers every request to its reply_to."""

    def __init__(self, url: str):
        self.url = url
        self.running = True
        self.answered = 0
        self.error: BaseException | None = None
        import gevent

        self.greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        while self.running:
            connection = None
            try:
                connection = pika.BlockingConnection(_parameters(self.url))
                channel = connection.channel()
                channel.queue_declare(RPC_QUEUE)
                channel.basic_qos(prefetch_count=100)

                def on_request(ch, method, properties, body):
                    if properties.reply_to:
                        ch.basic_publish(
                            exchange="", routing_key=properties.reply_to, body=body,
                            properties=pika.BasicProperties(
                                correlation_id=properties.correlation_id))
                    ch.basic_ack(method.delivery_tag)
                    self.answered += 1

                channel.basic_consume(RPC_QUEUE, on_request)
                while self.running:
                    connection.process_data_events(time_limit=0.2)
            except Exception as error:  # noqa: BLE001 - reconnect after a pause
                self.error = error
                time.sleep(1.0)
            finally:
                if connection is not None and connection.is_open:
                    try:
                        connection.close()
                    except Exception:  # noqa: BLE001
                        pass

    def stop(self) -> None:
        self.running = False
        self.greenlet.join(timeout=5)


_responder: Responder | None = None


@events.test_start.add_listener
def _start_responder(environment, **_kwargs) -> None:
    global _responder
    if RPC_WEIGHT <= 0 or isinstance(environment.runner, MasterRunner):
        return
    if _responder is None:
        _responder = Responder(environment.host or DEFAULT_URL)


@events.test_stop.add_listener
def _stop_responder(environment, **_kwargs) -> None:
    global _responder
    if _responder is not None:
        _responder.stop()
        _responder = None
    if CLEANUP and not isinstance(environment.runner, MasterRunner):
        try:
            connection = pika.BlockingConnection(_parameters(environment.host))
            channel = connection.channel()
            for queue in (WORK_QUEUE, RPC_QUEUE):
                channel.queue_delete(queue)
            connection.close()
        except Exception:  # noqa: BLE001 - best effort
            pass


# --- the user -----------------------------------------------------------------------------------


class AMQPUser(User):
    """One AMQP connection per user, with a confirm channel, a plain channel for gets
    and (on first use) a channel consuming the direct reply-to pseudo-queue."""

    wait_time = constant(WAIT)

    def on_start(self) -> None:
        self.connection = None
        self._connect()

    def on_stop(self) -> None:
        self._disconnect()

    # -- connection management ----------------------------------------------------------

    def _connect(self) -> None:
        self.connection = pika.BlockingConnection(_parameters(self.host))
        self.confirm_channel = self.connection.channel()
        self.confirm_channel.confirm_delivery()
        self.confirm_channel.queue_declare(WORK_QUEUE, durable=True)
        self.get_channel = self.connection.channel()
        self.rpc_channel = None
        self.replies: dict[str, bytes] = {}

    def _disconnect(self) -> None:
        if self.connection is not None:
            try:
                if self.connection.is_open:
                    self.connection.close()
            except Exception:  # noqa: BLE001
                pass
            self.connection = None

    def _ensure(self) -> None:
        if self.connection is None or not self.connection.is_open:
            self._disconnect()
            self._connect()

    def _report(self, name: str, started: float, length: int, error: BaseException | None,
                ) -> None:
        self.environment.events.request.fire(
            request_type="amqp", name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length, exception=error, context={})

    def _recover(self, error: BaseException) -> None:
        """After a failure: channel-level errors close a channel, so start afresh."""
        if isinstance(error, (pika.exceptions.AMQPError, OSError)):
            self._disconnect()

    # -- tasks -----------------------------------------------------------------------------

    @task(PUBLISH_WEIGHT)
    def publish_confirm(self) -> None:
        started = time.perf_counter()
        error = None
        try:
            self._ensure()
            started = time.perf_counter()
            self.confirm_channel.basic_publish(exchange="", routing_key=WORK_QUEUE, body=BODY,
                                               properties=PERSISTENT, mandatory=True)
        except Exception as exc:  # noqa: BLE001 - reported to Locust
            error = exc
        self._report("publish+confirm", started, len(BODY), error)
        if error is not None:
            self._recover(error)

    @task(CONSUME_WEIGHT)
    def get_ack(self) -> None:
        started = time.perf_counter()
        error = None
        name, length = "get+ack", 0
        try:
            self._ensure()
            started = time.perf_counter()
            method, _properties, body = self.get_channel.basic_get(WORK_QUEUE)
            if method is None:
                name = "get-empty"
            else:
                length = len(body)
                self.get_channel.basic_ack(method.delivery_tag)
        except Exception as exc:  # noqa: BLE001
            error = exc
        self._report(name, started, length, error)
        if error is not None:
            self._recover(error)

    def _rpc_setup(self) -> None:
        channel = self.connection.channel()
        channel.queue_declare(RPC_QUEUE)

        def on_reply(_ch, _method, properties, body):
            self.replies[properties.correlation_id] = body

        # Direct reply-to: consume from the pseudo-queue in no-ack mode *before*
        # publishing a request with reply_to set to it, on the same channel.
        channel.basic_consume(REPLY_TO, on_reply, auto_ack=True)
        self.rpc_channel = channel

    @task(RPC_WEIGHT)
    def rpc(self) -> None:
        started = time.perf_counter()
        error = None
        length = 0
        try:
            self._ensure()
            if self.rpc_channel is None or not self.rpc_channel.is_open:
                self._rpc_setup()
            started = time.perf_counter()
            correlation_id = uuid.uuid4().hex
            self.rpc_channel.basic_publish(
                exchange="", routing_key=RPC_QUEUE, body=BODY,
                properties=pika.BasicProperties(reply_to=REPLY_TO, correlation_id=correlation_id))
            deadline = started + RPC_TIMEOUT
            while correlation_id not in self.replies:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise RpcTimeout(f"no reply within {RPC_TIMEOUT:g} s")
                self.connection.process_data_events(time_limit=min(0.05, remaining))
            length = len(self.replies.pop(correlation_id))
        except Exception as exc:  # noqa: BLE001
            error = exc
        self._report("rpc direct-reply-to", started, length, error)
        if error is not None:
            self.rpc_channel = None
            self.replies.clear()
            self._recover(error)
