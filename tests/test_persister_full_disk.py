"""A shard that starts on a disk too full to apply its journal to LMDB recovers
its queues from LMDB with the journal's commits on top: the same queues, the same
messages in the same order with the same delivered marks and content as a start
that applied it. Hypothesis writes the stores: some commits checkpointed, the
rest left in the journal by a crash."""

from __future__ import annotations

import itertools
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from warren.shards.persister import Persister
from warren.shards.queue import ram_size
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore, StoredQueue, StoreFull, WriteBatch

QIDS = (1, 2, 3)

op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(QIDS), st.binary(max_size=24)),
    st.tuples(st.just("delete"), st.sampled_from(QIDS), st.integers(0, 30)),
    st.tuples(st.just("mark"), st.sampled_from(QIDS), st.integers(0, 30)),
    st.tuples(st.just("upto"), st.sampled_from(QIDS), st.integers(0, 30)),
    st.tuples(st.just("drop_queue"), st.sampled_from(QIDS), st.just(0)),
)
commits = st.lists(st.lists(op, min_size=1, max_size=8), min_size=1, max_size=8)


def write(path: str, batches: list[list[tuple]], checkpointed: int) -> None:
    """Commit the batches (the first `checkpointed` into LMDB, the others only to
    the journal), then stop as a crash does: nothing applied at the end."""
    store = ShardStore(path, 1 << 24)
    seqs = itertools.count(1)
    live: dict[int, list[int]] = {}
    for n, ops in enumerate(batches):
        batch = WriteBatch()
        for kind, qid, arg in ops:
            if qid not in live:
                live[qid] = []
                batch.put_queue(qid, StoredQueue(QueueSpec("/", f"q{qid}", True, False, False,
                                                           {}), {}))
            if kind == "put":
                seq = next(seqs)
                live[qid].append(seq)
                batch.put_message(qid, seq, ("", f"q{qid}", b"", arg))
            elif kind == "drop_queue":
                batch.delete_queue(qid)
                del live[qid]
            elif live[qid]:
                seq = live[qid][arg % len(live[qid])]
                if kind == "delete":
                    live[qid].remove(seq)
                    batch.delete_message(qid, seq)
                elif kind == "mark":
                    batch.mark_delivered(qid, seq)
                else:
                    batch.delivered_upto(qid, seq)
        store.append(batch)
        if n < checkpointed:
            store.checkpoint()
    store.env.close()
    store._journal.close()


def content_of(store: ShardStore, qid: int, msg) -> tuple:
    if msg.content is not None:  # in RAM: the journal's only
        return msg.content
    stored = store.read(qid, msg.seq)
    return stored.exchange, stored.routing_key, stored.properties, stored.body


def recovered(path: str) -> tuple[dict, int]:
    """(qid -> [(seq, redelivered, content)]), and the RAM the persister says the
    journal's messages hold; the store closed as a crash leaves it."""
    store = ShardStore(path, 1 << 24)
    persister = Persister({0: store}, 0)
    queues = persister.recover(0.0)
    found, ram = {}, 0
    for queue in queues:
        ram += queue.ram_bytes
        found[queue.qid] = [(msg.seq, msg.redelivered, content_of(store, queue.qid, msg))
                            for msg in queue.ready]
    journaled = sum(ram_size(msg.content) for queue in queues for msg in queue.ready
                    if msg.content is not None)
    assert ram == journaled
    store.env.close()
    store._journal.close()
    return found, ram


@settings(max_examples=60, deadline=None)
@given(batches=commits, data=st.data())
def test_a_journal_a_full_disk_keeps_out_of_lmdb_recovers_as_if_applied(batches, data):
    checkpointed = data.draw(st.integers(0, len(batches) - 1))
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/shard-0"
        write(path, batches, checkpointed)
        with pytest.MonkeyPatch.context() as patch:
            def refuse(self, batch, applied):
                raise StoreFull("mdb_txn_commit: No space left on device")

            patch.setattr(ShardStore, "_write", refuse)
            full, ram = recovered(path)
        applied, ram_after = recovered(path)  # now there is room: the journal applied
        assert full == applied
        assert ram_after == 0
