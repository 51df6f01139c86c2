"""What a shard link gathers for its next ring record: a run of acks is one Settle."""

from __future__ import annotations

import asyncio

from warren.gateway.shardlink import ShardLink
from warren.shards import records as r


def batch_of(records: list) -> list:
    async def gather() -> list:
        link = ShardLink(0, "", [], 0, 60.0, 1 << 20, on_events=None, on_exit=None)
        link.alive = True  # no process: only the batch is looked at
        link._flush_scheduled = True  # and never flushed
        for record in records:
            link.send(record)
        return link._batch
    return asyncio.run(gather())


def test_consecutive_settles_of_one_holder_and_outcome_are_one_record():
    got = batch_of([r.Settle(1, 7, [1], r.SETTLE_ACK), r.Settle(1, 7, [2, 3], r.SETTLE_ACK),
                    r.Settle(1, 7, [4], r.SETTLE_ACK)])
    assert got == [r.Settle(1, 7, [1, 2, 3, 4], r.SETTLE_ACK)]


def test_settles_stay_apart_across_holders_outcomes_and_other_records():
    records = [r.Settle(1, 7, [1], r.SETTLE_ACK), r.Settle(1, 8, [1], r.SETTLE_ACK),
               r.Settle(1, 8, [2], r.SETTLE_REQUEUE), r.Grant(1, 8, 5),
               r.Settle(1, 8, [3], r.SETTLE_REQUEUE), r.Settle(2, 8, [4], r.SETTLE_REQUEUE)]
    assert batch_of([*records]) == records
