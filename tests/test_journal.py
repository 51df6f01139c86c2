"""A store's journal: a commit is durable once appended, and whatever moment a
process dies at, the store it left opens with every appended commit and nothing
else. A crash is a copy of the store's files taken while it is open (what the
page cache held: a killed process loses nothing it wrote), optionally with a
torn record at the journal's end (a write the crash cut short, never confirmed)."""

from __future__ import annotations

import os
import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.storage import journal
from warren.storage.journal import HEADER_SIZE, Journal
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore, StoredQueue, WriteBatch

QUEUE = StoredQueue(QueueSpec("/", "q", True, False, False, {}), {})


def test_records_read_back_until_the_first_break(tmp_path):
    path = str(tmp_path / "journal")
    j = Journal(path)
    for number in (1, 2, 3):
        j.append(number, b"payload %d" % number)
    assert journal.read(path) == [(1, b"payload 1"), (2, b"payload 2"), (3, b"payload 3")]
    j.start_over()  # applied elsewhere: a closed journal reads empty
    assert journal.read(path) == []
    j.append(4, b"four")
    assert journal.read(path) == [(4, b"four")]  # not followed by the older records
    j.close()
    with open(path, "r+b") as f:  # one flipped payload byte ends the journal there
        f.seek(HEADER_SIZE + 1)
        f.write(b"X")
    assert journal.read(path) == []


def test_a_record_that_does_not_follow_ends_the_journal(tmp_path):
    path = str(tmp_path / "journal")
    j = Journal(path)
    j.append(5, b"a")
    j.append(7, b"b")  # not 6: as a record left over from an earlier cycle would be
    j.close()
    assert journal.read(path) == [(5, b"a")]


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(1, 12), st.binary(max_size=40)),
    st.tuples(st.just("delete"), st.integers(1, 12)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("crash"), st.binary(max_size=2 * HEADER_SIZE))), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_a_crash_at_any_moment_keeps_every_appended_commit(tmp_path_factory, script):
    root = tmp_path_factory.mktemp("journal")
    live = str(root / "live")
    store = ShardStore(live, 1 << 24)
    try:  # (closed whatever happens: a failing example must not leak its files)
        durable = _play(script, store, root)
    finally:
        store.close()
    assert _contents(live) == durable  # closed cleanly: checkpointed


def _play(script: list, store: ShardStore, root) -> dict[int, bytes]:
    """Run the script on an open store, checking each crash image; what the
    appended commits hold at the end."""
    live = str(root / "live")
    store.commit(_with_queue())
    durable: dict[int, bytes] = {}  # what the appended commits hold
    pending, pending_model = WriteBatch(), {}
    written: set[int] = set()
    crashes = 0
    for op in script:
        if op[0] == "put":
            if op[1] in written:  # a queue never reuses a sequence number
                continue
            written.add(op[1])
            pending.put_message(1, op[1], ("", "q", b"", op[2]))
            pending_model[op[1]] = op[2]
        elif op[0] == "delete":
            pending.delete_message(1, op[1])
            pending_model[op[1]] = None
        elif op[0] == "commit":
            store.append(pending)
            for seq, body in pending_model.items():
                if body is None:
                    durable.pop(seq, None)
                else:
                    durable[seq] = body
            pending, pending_model = WriteBatch(), {}
        elif op[0] == "checkpoint":
            store.checkpoint()
        else:
            crashes += 1
            image = str(root / f"crash{crashes}")
            shutil.copytree(live, image)
            _tear(os.path.join(image, "journal"), store._journal.offset, op[1])
            assert _contents(image) == durable
    return durable


def _with_queue() -> WriteBatch:
    batch = WriteBatch()
    batch.put_queue(1, QUEUE)
    return batch


def _tear(path: str, offset: int, garbage: bytes) -> None:
    """A record the crash cut short where the next append would have gone."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(garbage)


def _contents(path: str) -> dict[int, bytes]:
    store = ShardStore(path, 1 << 24)
    try:
        seqs = [seq for seq, *_ in store.recover(1)]
        return {seq: message.body
                for seq, message in zip(seqs, store.read_many([(1, s) for s in seqs]))}
    finally:
        store.close()
