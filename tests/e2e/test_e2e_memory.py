"""A backlog larger than a shard's RAM budget: durable queues keep only an index in
RAM, so 1,000,000 persistent 1 KiB messages leave the whole broker under 400 MB.

The broker's resident memory is the sum of its processes' PSS: the shared-memory
rings are resident once, not once in the gateway and again in each shard."""

from __future__ import annotations

import os

import pytest

from ..support.broker import wait_until
from ..support.confirmpublisher import ConfirmPublisher
from .test_e2e_basic import shard_pids

pytestmark = pytest.mark.slow  # started first: the two workers then finish together


def pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.shard_side  # the messages are held by the shards
def test_million_persistent_messages_fit_in_400_mb(fresh_broker):
    fresh_broker.start()
    publisher = ConfirmPublisher(fresh_broker.port, "backlog")
    body = os.urandom(1024)
    total = 1_000_000
    try:
        while publisher.sent < total:
            # Keep at most 20,000 unconfirmed, as a careful publisher would.
            wait_until(lambda: publisher.sent - len(publisher.acked) < 20_000, timeout=60)
            publisher.publish(min(5_000, total - publisher.sent), body=body)
        wait_until(lambda: len(publisher.acked) == total, timeout=120)
        assert not publisher.nacked
        pids = [fresh_broker.process.pid, *shard_pids(fresh_broker)]
        rss = sum(pss_bytes(pid) for pid in pids)
        detail = {pid: rss_detail(pid) for pid in pids}
        print(f"broker RSS with 1M persistent 1 KiB messages: {rss / 2**20:.0f} MiB {detail} "
              f"over {len(pids)} processes")
        assert rss < 400 * 2**20
    finally:
        publisher.close()


def rss_detail(pid: int) -> str:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("Rss", "Pss")))
    return " ".join(f"{k}={v.strip()}" for k, v in fields.items())
