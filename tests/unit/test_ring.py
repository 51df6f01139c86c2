"""The shared-memory SPSC ring: wrap-around, full ring, doorbells, oversize
records, a model-based property test, and a million records between processes."""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
from collections import deque

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.shards.ring import Ring, remove_orphans

from ..support.broker import ROOT
from ..support.twins import BATCH_CODECS, RINGS


@pytest.fixture(params=RINGS)
def ring(request):
    """Makes rings on one core or the other (each test runs with both)."""
    made = []

    def make(capacity: int) -> Ring:
        r = request.param.create(capacity)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
        r.unlink()


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_wrap_around_keeps_content_and_order(ring):
    r = ring(4096)
    sent, got = [], []
    for i in range(5000):
        record = os.urandom(1 + (i * 37) % 300)
        while not r.write(record):
            got += r.read_many()
        sent.append(record)
    got += r.read_many()
    assert got == sent


def test_full_ring_takes_what_fits_and_frees_space_on_read(ring):
    r = ring(1024)
    records = [bytes([i]) * 100 for i in range(20)]
    taken = r.write_many(records)
    assert 0 < taken < 20
    assert not r.write(b"x" * 100)
    assert r.read_many(max_records=3) == records[:3]
    assert r.write_many(records[taken:]) > 0


def test_space_doorbell_wakes_a_waiting_writer(ring):
    r = ring(1024)
    while r.write(b"y" * 100):
        pass
    assert r.want_space()  # still full: the writer will wait on space_fd
    assert not readable(r.spec().space_fd)
    r.read_many()
    assert readable(r.spec().space_fd, 1.0)
    r.clear_space_doorbell()
    assert not readable(r.spec().space_fd)
    assert r.write(b"y" * 100)


def test_data_doorbell_rings_only_for_a_sleeping_reader(ring):
    r = ring(4096)
    r.write(b"a")
    r.flush()
    assert not readable(r.spec().data_fd)  # the reader never said it sleeps
    assert r.read_many() == [b"a"]
    assert r.sleep()  # empty: the reader goes to sleep
    r.write(b"b")
    assert not readable(r.spec().data_fd)  # written, not yet flushed
    r.flush()
    assert readable(r.spec().data_fd, 1.0)
    r.clear_data_doorbell()
    assert r.read_many() == [b"b"]
    r.write(b"c")
    assert not r.sleep()  # data arrived before sleeping: no wait, no lost wake-up
    r.flush()
    assert not readable(r.spec().data_fd)


def test_oversize_records_are_fragmented_and_joined(ring):
    r = ring(1 << 20)
    big = os.urandom(10 << 20)
    sent = [b"small-1", big, b"small-2", big[:3 << 20]]
    got = []
    pending = deque(sent)
    while pending or r.backlogged():
        taken = r.write_many(list(pending))
        for _ in range(taken):
            pending.popleft()
        got += r.read_many()
    got += r.read_many()
    assert got == sent


def test_records_written_from_pieces_arrive_as_one_record(ring):
    # A batch's encoding with its large bodies behind it: pieces, some larger than
    # a fragment, written back to back; the reader sees one record, in order with
    # the plain ones around it.
    r = ring(1 << 20)
    pieces = [b"head", os.urandom(300_000), b"", os.urandom(5), os.urandom(2 << 20)]
    sent = [b"before", pieces, b"after", [b"a", b"b"]]
    got = []
    pending = deque(sent)
    while pending or r.backlogged():
        for _ in range(r.write_many(list(pending))):
            pending.popleft()
        got += r.read_many()
    got += r.read_many()
    assert got == [b"before", b"".join(pieces), b"after", b"ab"]


def test_the_reader_decodes_records_in_place(ring):
    # decode sees a view of the ring, never a copy, and what it returns is the record
    r = ring(4096)
    r.write_many([b"one", [b"tw", b"o"]])
    assert r.read_many(lambda view: (type(view), bytes(view))) == [
        (memoryview, b"one"), (memoryview, b"two")]
    assert r.is_empty()


@pytest.mark.parametrize("build", BATCH_CODECS)
def test_large_bodies_cross_beside_the_batch_not_inside_its_msgpack(ring, build):
    from warren.shards import records as rec
    big, huge = os.urandom(build.SIDE_BODY_MIN), os.urandom(3 << 20)
    commands = [rec.Publish([1], "", "k", b"p", b"small", False),
                rec.Publish([1, 2], "x", "k", b"\x80\x00", big, True, 3, 4),
                rec.Settle(1, 2, [3], rec.SETTLE_ACK),
                rec.Publish([2], "", "k", b"", huge, False)]
    events = [rec.Deliver(7, 1, 9, False, "", "k", b"", big),
              rec.GetReply(1, 1, 10, body=huge), rec.Deliver(7, 1, 11, True, "", "k", b"", b"x")]
    encoded = build.encode_batch(commands)
    # the bodies are pieces of their own, the records untouched by encoding
    assert isinstance(encoded, list) and encoded[-2] is big and encoded[-1] is huge
    assert commands[1].body is big and commands[3].body is huge
    r = ring(1 << 20)
    got = []
    decoders = iter([build.decode_commands, build.decode_events])
    pending = deque([encoded, build.encode_batch(events)])
    while pending or r.backlogged():
        for _ in range(r.write_many(list(pending))):
            pending.popleft()
        got += r.read_many(lambda view: next(decoders)(view))
    assert got == [commands, events]


@pytest.mark.parametrize("ring_class", RINGS)
@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 600).map(lambda n: ("write", n)),
                          st.integers(1, 5).map(lambda n: ("read", n))), max_size=80))
def test_matches_a_fifo_model(ring_class, operations):
    r = ring_class.create(2048)
    try:
        model: deque[bytes] = deque()
        counter = 0
        for op, n in operations:
            if op == "write":
                counter += 1
                record = struct.pack(">I", counter) * (n // 4 + 1)
                if r.write(record):
                    model.append(record)
                else:
                    assert r.free_space() < len(record) + 8 + r.capacity // 8 or r.backlogged()
            else:
                got = r.read_many(max_records=n)
                expected = [model.popleft() for _ in range(min(n, len(model)))]
                # Fragmented records may need their remaining pieces written first.
                while r.backlogged() and len(got) < len(expected):
                    r.write_many([])
                    got += r.read_many(max_records=n - len(got))
                assert got == expected
        rest = []
        while r.backlogged() or not r.is_empty():
            r.write_many([])
            rest += r.read_many()
        assert rest == list(model)
    finally:
        r.close()
        r.unlink()


PRODUCER = """
import select, struct, sys, msgspec
from warren.shards.ring import Ring, RingSpec
ring = Ring.attach(msgspec.json.decode(sys.argv[1], type=RingSpec))
total, batch = int(sys.argv[2]), 256
seq = 0
while seq < total:
    records = [struct.pack(">Q", n) for n in range(seq, min(seq + batch, total))]
    while records:
        taken = ring.write_many(records)
        ring.flush()
        seq += taken
        del records[:taken]
        if records and ring.want_space():
            select.select([ring.spec().space_fd], [], [], 5)
            ring.clear_space_doorbell()
ring.close()
"""


def test_million_records_between_two_processes(ring):
    """The producer is the broker's own Ring (the compiled core where built), the
    reader each twin: the two cores share one layout."""
    r = ring(1 << 20)
    total = 1_000_000
    spec = r.spec()
    child = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, msgspec.json.encode(spec).decode(), str(total)],
        pass_fds=[spec.data_fd, spec.space_fd], cwd=ROOT, stderr=subprocess.PIPE)
    expected = 0
    try:
        while expected < total:
            records = r.read_many()
            if not records:
                if r.sleep():
                    assert readable(spec.data_fd, 10.0), "producer stalled"
                    r.clear_data_doorbell()
                continue
            for record in records:
                (n,) = struct.unpack(">Q", record)
                assert n == expected, "lost, duplicated or reordered"
                expected += 1
        assert child.wait(20) == 0
        stderr = child.stderr.read().decode()
        assert "leaked shared_memory" not in stderr and "Traceback" not in stderr, stderr
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    assert r.is_empty()


def test_rings_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for name in (f"warren_{gone.pid}_0a1b2c3d", f"warren_{os.getpid()}_4e5f6a7b",
                 "warren_notapid_01234567", "psm_1234", f"other_{gone.pid}_0a1b2c3d"):
        (tmp_path / name).write_bytes(b"ring")
    assert remove_orphans(str(tmp_path)) == [f"warren_{gone.pid}_0a1b2c3d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        f"warren_{os.getpid()}_4e5f6a7b", "warren_notapid_01234567", "psm_1234",
        f"other_{gone.pid}_0a1b2c3d"])


@pytest.mark.parametrize("ring_class", RINGS)
def test_rings_sharing_a_doorbell_ring_it_and_leave_it_open(ring_class):
    doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    rings = [ring_class.create(4096, doorbell) for _ in range(2)]
    try:
        assert all(r.sleep() for r in rings)  # the reader sleeps on both
        rings[1].write(b"for the second")
        rings[1].flush()
        assert readable(doorbell)
        assert rings[1].read_many() == [b"for the second"]
    finally:
        for r in rings:
            r.close()
            r.unlink()
    os.eventfd_write(doorbell, 1)  # still open: its owner closes it
    os.close(doorbell)


def test_a_reset_ring_forgets_half_written_records(ring):
    r = ring(4096)
    assert r.write(b"x" * 6000)  # more than the ring: fragments wait in the writer
    assert r.read_many() == [] and r.backlogged()  # the reader holds the first ones
    r.reset()
    assert r.is_empty() and not r.backlogged() and r.free_space() == r.capacity
    assert r.write(b"new") and r.read_many() == [b"new"]


@pytest.mark.parametrize("ring_class", RINGS)
def test_a_closed_ring_refuses_to_be_used(ring_class):
    r = ring_class.create(4096)
    r.close()
    r.unlink()
    with pytest.raises(ValueError):
        r.is_empty()
    with pytest.raises(ValueError):
        r.write_many([b"late"])


@pytest.mark.skipif(len(RINGS) < 2, reason="the compiled core is not built")
@pytest.mark.parametrize("writer_class,reader_class", [
    (RINGS[0].values[0], RINGS[-1].values[0]), (RINGS[-1].values[0], RINGS[0].values[0])],
    ids=["pure-to-compiled", "compiled-to-pure"])
@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 700).map(lambda n: ("write", n)),
                          st.integers(1, 4).map(lambda n: ("read", n))), max_size=60))
def test_either_core_reads_what_the_other_wrote(writer_class, reader_class, operations):
    """One segment, a core at each end (as a pure gateway and a compiled shard
    would be): odd sizes, wraps and fragments come out whole and in order."""
    writer = writer_class.create(1024)
    reader = reader_class.attach(writer.spec())
    try:
        sent, got, counter = [], [], 0
        for op, n in operations:
            if op == "write":
                counter += 1
                record = bytes((counter % 251,)) * n
                if writer.write(record):
                    sent.append(record)
            else:
                writer.write_many([])  # waiting fragments follow as room appears
                got += reader.read_many(max_records=n)
        for _ in range(len(operations) + 10):  # bounded: a broken layout fails, never hangs
            if not writer.backlogged() and reader.is_empty():
                break
            writer.write_many([])
            got += reader.read_many()
        assert got == sent
    finally:
        reader.close()
        writer.close()
        writer.unlink()
