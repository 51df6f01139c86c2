"""A store's journal: a commit is durable once appended, and whatever moment a
process dies at, the store it left opens with every appended commit and nothing
else. A crash is a copy of the store's files taken while it is open (what the
page cache held: a killed process loses nothing it wrote), optionally with a
torn record at the journal's end (a write the crash cut short, never confirmed)."""

from __future__ import annotations

import errno
import os
import shutil
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.storage import journal
from warren.storage.journal import BLOCK, HEADER_SIZE, KEEP_BUFFER, TRAILER_SIZE, Journal
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore, StoredQueue, WriteBatch

QUEUE = StoredQueue(QueueSpec("/", "q", True, False, False, {}), {})


@pytest.fixture(autouse=True, scope="module", params=["direct", "buffered"])
def mode(request):
    """Every test runs with appends written through O_DIRECT (where the
    filesystem allows it) and with a write and an fdatasync."""
    journal.DIRECT = request.param == "direct"
    yield request.param
    journal.DIRECT = True


def test_appends_bypass_the_page_cache_where_the_filesystem_allows(tmp_path, mode):
    path = str(tmp_path / "journal")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_DSYNC))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    j = Journal(path)
    assert j.direct == (mode == "direct")
    j.append(1, b"one")
    assert journal.read(path) == [(1, b"one")]
    j.close()


def test_a_filesystem_that_refuses_a_direct_write_gets_a_buffered_one(tmp_path, monkeypatch):
    path = str(tmp_path / "journal")
    j = Journal(path)
    j.append(1, b"one")

    def refuse(*args):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(journal.os, "pwritev", refuse)
    j.append(2, b"two" * 2000)  # refused as a direct write, made as a buffered one
    assert not j.direct
    j.append(3, b"three")
    assert journal.read(path) == [(1, b"one"), (2, b"two" * 2000), (3, b"three")]
    j.close()
    monkeypatch.setattr(journal.os, "preadv", refuse)  # nor a direct read: a buffered one
    j = Journal(path)
    assert j.records() == [(1, b"one"), (2, b"two" * 2000), (3, b"three")]
    j.close()


sizes = st.integers(0, 3 * BLOCK) | st.sampled_from(
    [BLOCK - HEADER_SIZE, BLOCK - HEADER_SIZE - 1, BLOCK - HEADER_SIZE + 1, KEEP_BUFFER + 1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("append"), sizes),
                          st.tuples(st.just("start over")),
                          st.tuples(st.just("reopen"))), max_size=30))
def test_whatever_the_sizes_the_journal_reads_back_what_was_appended(tmp_path_factory, script):
    """Records of any size (within a block, across blocks, ending on a block's
    edge, larger than the buffer kept) read back in order, by the open journal
    and by a new one, across cycles: what a direct append rewrites of the tail
    block, and the zeros behind the record, never change what was written."""
    path = str(tmp_path_factory.mktemp("journal") / "journal")
    j = Journal(path)
    model: list[tuple[int, bytes]] = []  # what reading the file finds
    number = 0
    reopened = False  # a new journal writes from the start, over what it found
    try:
        for op in script:
            if op[0] == "append":
                number += 1
                payload = bytes([number % 251]) * op[1]
                assert j.append(number, payload) == HEADER_SIZE + op[1] + TRAILER_SIZE
                if reopened:
                    model, reopened = [], False
                model.append((number, payload))
            elif op[0] == "start over":
                j.start_over()
                if not reopened:  # (what it found was applied: left to be written over)
                    model = []
            else:  # a new process opens it: records() is what the store replays
                j.close()
                j = Journal(path)
                assert j.records() == model
                reopened = True
            assert journal.read(path) == model
            if j.direct and j.offset % BLOCK:  # a direct write fills its last block with zeros
                with open(path, "rb") as f:
                    f.seek(j.offset)
                    assert f.read(BLOCK - j.offset % BLOCK) == bytes(BLOCK - j.offset % BLOCK)
    finally:
        j.close()


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


def _written(tmp_path, count: int, size: int = 300) -> tuple[str, list[tuple[int, int]]]:
    """A journal with records 1..count (a crash left it open), and their extents."""
    path = str(tmp_path / "journal")
    j = Journal(path)
    extents = []
    for number in range(1, count + 1):
        start = j.offset
        j.append(number, bytes([number]) * size)
        extents.append((start, j.offset))
    j.close()
    return path, extents


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5000), st.data())
def test_a_torn_last_append_is_the_end_and_a_flip_before_it_is_damage(tmp_path_factory, count,
                                                                         size, data):
    """A crash tears at most the append under way (never confirmed): any prefix of
    it on disk reads as the journal's end. A bit flipped in a record written
    whole (its mark, checksums or payload) is damage, and a salvage keeps every
    other record."""
    path, extents = _written(tmp_path_factory.mktemp("journal"), count, size)
    with open(path, "rb") as f:
        clean = f.read()
    records = [(n, bytes([n]) * size) for n in range(1, count + 1)]
    torn = data.draw(st.integers(0, extents[-1][1] - extents[-1][0] - 1))
    start = extents[-1][0]
    image = clean[:start + torn] + bytes(len(clean) - start - torn)  # the rest never written
    found = journal.scan(image)
    # (Torn in its trailer only, it is whole enough to read: never confirmed,
    # and replayed, as a record written whole but not confirmed before a crash.)
    whole = torn >= extents[-1][1] - start - TRAILER_SIZE
    assert found.damage is None and found.records == (records if whole else records[:-1])

    victim = data.draw(st.integers(0, count - 1))
    begin, end = extents[victim]
    # Anywhere but the length and number fields (a flip there reads as a tear or
    # as a record of an earlier cycle when it hits the last record) and the
    # trailer (the record is read without it).
    at = data.draw(st.sampled_from([*range(begin, begin + 4),
                                    *range(begin + 16, end - TRAILER_SIZE)]))
    flipped = bytearray(clean)
    flipped[at] ^= 1 << data.draw(st.integers(0, 7))
    found = journal.scan(bytes(flipped))
    assert found.damage is not None
    assert found.salvage(0) == records[:victim] + records[victim + 1:]


def test_records_of_an_earlier_cycle_after_the_end_are_not_damage(tmp_path):
    path, _ = _written(tmp_path, 5)
    j = Journal(path)
    j.start_over()  # records 1-5 applied: 6 and 7 written over their start
    j.append(6, b"six")
    j.append(7, b"seven")
    j.close()
    found = journal.read_scan(path, applied=5)
    assert found.damage is None and found.records == [(6, b"six"), (7, b"seven")]


def test_a_journal_cut_short_or_emptied_is_damage(tmp_path):
    path, extents = _written(tmp_path, 3)
    size = os.path.getsize(path)
    assert size % BLOCK == 0  # created with a block, grown by blocks
    os.truncate(path, extents[1][1] + 10)
    found = journal.read_scan(path)
    assert found.cut and found.records == [(1, bytes([1]) * 300), (2, bytes([2]) * 300)]
    os.truncate(path, 0)
    assert journal.read_scan(path).cut


def test_a_journal_an_earlier_warren_wrote_is_read_as_it_read_it(tmp_path):
    old = struct.Struct("<IQ")
    raw = b""
    for number, payload in ((3, b"three"), (4, b"four")):
        head = old.pack(len(payload), number)
        raw += head + xxhash.xxh3_64_digest(head + payload) + payload
    found = journal.scan(raw + bytes(BLOCK - len(raw)))
    assert found.damage is None and found.records == [(3, b"three"), (4, b"four")]
