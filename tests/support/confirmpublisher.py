"""A confirm-mode publisher on the project's codec that records exactly what the
broker answered, for kill tests: which sequence numbers were acked, which nacked,
and whether any was answered twice."""

from __future__ import annotations

import socket
import struct
import threading

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

from .rawclient import RawClient

PERSISTENT = bytes.fromhex("1000") + b"\x02"  # property flags: delivery-mode only, = 2


class ConfirmPublisher:
    def __init__(self, port: int, queue: str):
        self.client = RawClient(port, timeout=30)
        self.client.handshake()
        self.client.open_channel(1)
        self.client.send_method(1, m.QueueDeclare(queue=queue, durable=True))
        self.client.next_method()
        self.client.send_method(1, m.ConfirmSelect())
        self.client.next_method()
        self.queue = queue
        self.sent = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.answered_twice: set[int] = set()
        self.closed = threading.Event()
        self._lowest_unanswered = 1
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()

    def publish(self, count: int, body: bytes = b"") -> None:
        """Publish `count` persistent messages; each body starts with its sequence number."""
        payload = m.encode_method(m.BasicPublish(exchange="", routing_key=self.queue))
        parts = []
        for _ in range(count):
            self.sent += 1
            content = struct.pack(">Q", self.sent) + body
            parts.append(frames.content_frames(1, payload, 60, PERSISTENT, content, 131072))
        self.client.send(b"".join(parts))

    def _answer(self, seq: int, ack: bool) -> None:
        if seq in self.acked or seq in self.nacked:
            self.answered_twice.add(seq)
        (self.acked if ack else self.nacked).add(seq)

    def _read_answers(self) -> None:
        try:
            while True:
                frame = self.client.next_frame(timeout=3600)
                if frame is None:
                    break
                frame_type, _, payload = frame
                if frame_type != frames.FRAME_METHOD:
                    continue
                method = m.decode_method(payload)
                if isinstance(method, (m.BasicAck, m.BasicNack)):
                    ack = isinstance(method, m.BasicAck)
                    tag = method.delivery_tag
                    if method.multiple:
                        for seq in range(self._lowest_unanswered, tag + 1):
                            if seq not in self.acked and seq not in self.nacked:
                                self._answer(seq, ack)
                    else:
                        self._answer(tag, ack)
                    while (self._lowest_unanswered in self.acked
                           or self._lowest_unanswered in self.nacked):
                        self._lowest_unanswered += 1
        except OSError:
            pass
        finally:
            self.closed.set()

    def close(self) -> None:
        try:  # shutdown wakes the reader thread's recv; close alone would not
            self.client.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.client.close()
        self._reader.join(5)
