"""A shard on a full disk. Started with commits its journal holds that LMDB had
no room for, it recovers its queues from LMDB with the journal's commits on top:
the same queues, messages, order, delivered marks and content as a start that
applied them (hypothesis writes the stores: some commits checkpointed, the rest
left in the journal by a crash), and what it appends goes behind them. And the
commits its journal cannot take reach LMDB with the next checkpoint."""

from __future__ import annotations

import itertools
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def build(batches: list[list[tuple]]) -> list[WriteBatch]:
    """The write batches the ops make, as a shard would: each message put once, and
    a queue dropped and declared again under a new id (ids are never reused)."""
    seqs, qids = itertools.count(1), itertools.count(1)
    live: dict[int, tuple[int, list[int]]] = {}  # queue -> (its id, its messages)
    upto: dict[int, int] = {}  # qid -> the highest seq delivered in order
    built = []
    for ops in batches:
        batch = WriteBatch()
        for kind, name, arg in ops:
            if name not in live:
                live[name] = (next(qids), [])
                batch.put_queue(live[name][0], StoredQueue(
                    QueueSpec("/", f"q{name}", True, False, False, {}), {}))
            qid, messages = live[name]
            if kind == "put":
                seq = next(seqs)
                messages.append(seq)
                batch.put_message(qid, seq, ("", f"q{name}", b"", arg))
            elif kind == "drop_queue":
                batch.delete_queue(qid)
                del live[name]
            elif messages:
                seq = messages[arg % len(messages)]
                if kind == "delete":
                    messages.remove(seq)
                    batch.delete_message(qid, seq)
                elif kind == "mark":
                    batch.mark_delivered(qid, seq)
                elif seq > upto.get(qid, 0):  # a queue hands its messages out in order
                    upto[qid] = seq
                    batch.delivered_upto(qid, seq)
        built.append(batch)
    return built


def crash(store: ShardStore) -> None:
    """Stop as a crash does: nothing applied at the end."""
    store.env.close()
    store._journal.close()


def write(path: str, batches: list[WriteBatch], checkpointed: int) -> None:
    """Commit the batches (the first `checkpointed` into LMDB, the others only to
    the journal), then crash."""
    store = ShardStore(path, 1 << 24)
    for n, batch in enumerate(batches):
        store.append(batch)
        if n < checkpointed:
            store.checkpoint()
    crash(store)


def content_of(store: ShardStore, qid: int, msg) -> tuple:
    if msg.content is not None:  # in RAM: the journal's only
        return msg.content
    stored = store.read(qid, msg.seq)
    return stored.exchange, stored.routing_key, stored.properties, stored.body


def recovered(path: str, more: list[WriteBatch] = ()) -> tuple[dict, int]:
    """(qid -> [(seq, redelivered, content)]), and the RAM the persister says the
    journal's messages hold; then `more` commits, and a crash."""
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
    for batch in more:
        store.append(batch)
    crash(store)
    return found, ram


def refuse(self, batch, applied):
    raise StoreFull("mdb_txn_commit: No space left on device")


@settings(max_examples=60, deadline=None)
@given(batches=commits, data=st.data())
def test_a_journal_a_full_disk_keeps_out_of_lmdb_recovers_as_if_applied(batches, data):
    """Written, crashed, started on a full disk (recovered with the journal on top),
    more commits appended behind the journal's, crashed again, started with room:
    each start recovers what applying every commit so far gives."""
    stopped = data.draw(st.integers(1, len(batches)))  # commits before the first crash
    checkpointed = data.draw(st.integers(0, stopped - 1))
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/shard-0"
        write(path, build(batches)[:stopped], checkpointed)
        write(f"{folder}/before", build(batches)[:stopped], stopped)
        write(f"{folder}/after", build(batches), len(batches))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ShardStore, "_write", refuse)
            found, ram = recovered(path, build(batches)[stopped:])
        assert found == recovered(f"{folder}/before")[0]
        again, ram_after = recovered(path)  # now there is room: the journal applied
        assert again == recovered(f"{folder}/after")[0]
        assert ram_after == 0


def test_what_a_full_journal_refuses_reaches_lmdb_with_the_next_checkpoint(tmp_path):
    """The journal cannot grow (a full disk) but LMDB has room, or gets it from
    this very commit: the acks the journal refused are written by the retry's
    checkpoint, not kept out of it forever."""
    path = str(tmp_path / "shard-0")
    write(path, build([[("put", 1, b"a"), ("put", 1, b"b")]]), 1)
    store = ShardStore(path, 1 << 24)
    persister = Persister({0: store}, 0)
    (queue,) = persister.recover(0.0)
    with pytest.MonkeyPatch.context() as patch:
        def full(number, payload):
            raise OSError(28, "No space left on device")

        patch.setattr(store._journal, "append", full)
        persister.remove(queue.qid, [1, 2])
        assert not persister.commit(lambda qid, msg: None).ok  # refused, kept to retry
        persister.retry_at = 0.0  # the retry is due
        assert persister.commit(lambda qid, msg: None).ok
    store.close()
    assert recovered(path)[0] == {queue.qid: []}
