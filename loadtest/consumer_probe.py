"""A quick consumer-throughput probe on the project's codec: one pipelined
publisher thread, one consumer (auto-ack or manual ack with a prefetch), 100-byte
bodies. `python -m loadtest.consumer_probe PORT COUNT noack|PREFETCH`.

The consumer acks with multiple=true once per socket read, as fast clients do.
"""

from __future__ import annotations

import sys
import threading
import time

from gateway import frames
from gateway import methods as m
from tests.rawclient import RawClient

DELIVER_PREFIX = m.encode_method(m.BasicDeliver())[:4]


def main(argv: list[str]) -> None:
    port, count, mode = int(argv[0]), int(argv[1]), argv[2]
    prefetch = int(mode) if mode.isdigit() else 0
    consumer = RawClient(port)
    consumer.handshake()
    consumer.open_channel(1)
    consumer.send_method(1, m.QueueDeclare(queue="probe"))
    consumer.next_method()
    if prefetch:
        consumer.send_method(1, m.BasicQos(prefetch_count=prefetch))
        consumer.next_method()
    consumer.send_method(1, m.BasicConsume(queue="probe", no_ack=not prefetch))
    consumer.next_method()
    publisher = RawClient(port)
    publisher.handshake()
    publisher.open_channel(1)
    one = frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key="probe")), 60,
                                b"\x00\x00", b"x" * 100, 131072)

    def publish() -> None:
        for _ in range(count // 500):
            publisher.sock.sendall(one * 500)

    started = time.monotonic()
    threading.Thread(target=publish, daemon=True).start()
    received = 0
    while received < count:
        consumer.reader.receive_data(consumer.sock.recv(1 << 20))
        while (frame := consumer.reader.next_frame()) is not None:
            if frame[0] == frames.FRAME_METHOD and frame[2][:4] == DELIVER_PREFIX:
                received += 1
        if prefetch and received:
            consumer.send_method(1, m.BasicAck(delivery_tag=received, multiple=True))
    elapsed = time.monotonic() - started
    print(f"{mode}: {count} messages in {elapsed:.2f}s = {count / elapsed:,.0f} msg/s")


if __name__ == "__main__":
    main(sys.argv[1:])
