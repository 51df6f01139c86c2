"""A stream's segment log, its API: offsets run on without a gap, readers see
what is durable and nothing else, start where they are told, and a seek or an
open reads one index step, not the log; retention drops whole old segments.
Crashes and damage: test_segmentlog_crash.py."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.storage import segmentlog, segmentrecord
from warren.storage.segmentlog import SegmentLog
from warren.storage.segmentrecord import HEAD_SIZE

SMALL = dict(max_segment_bytes=600, index_records=4, index_bytes=200)


def payload(offset: int, size: int) -> bytes:
    return (b"%d." % offset * (size // 2 + 1))[:size]


def segment_files(path) -> list[str]:
    return sorted(name for name in os.listdir(path) if name.endswith(".seg"))


def read_all(log: SegmentLog, start="first") -> list[tuple[int, int, bytes]]:
    reader = log.reader(start)
    found = []
    while batch := reader.read(7, 300):
        found += batch
    return found


def test_offsets_run_from_zero_and_readers_see_only_what_is_synced(tmp_path):
    log = SegmentLog.open(str(tmp_path / "s"))
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, 0, -1)
    reader = log.reader("first")
    assert log.append(b"a", 10) == 0
    assert log.append_many([b"b", b"c"], 11) == range(1, 3)
    assert reader.read() == []
    log.flush()
    assert reader.read() == []  # written, not durable: not confirmed, not delivered
    log.sync()
    assert log.durable_offset == 2
    assert reader.read() == [(0, 10, b"a"), (1, 11, b"b"), (2, 11, b"c")]
    log.append(b"d", 12)
    log.sync()
    assert reader.read() == [(3, 12, b"d")]
    assert segment_files(tmp_path / "s") == ["00000000000000000000.seg"]
    log.close()


def test_a_sync_runs_in_another_thread_while_appends_go_on(tmp_path, monkeypatch):
    """The shard's committer thread runs the sync point; the records appended
    meanwhile are not covered by it."""
    synced = []
    real_sync, real_fsync = os.fdatasync, os.fsync
    monkeypatch.setattr(segmentlog.os, "fdatasync", lambda fd: synced.append(
        os.readlink(f"/proc/self/fd/{fd}")) or real_sync(fd))
    monkeypatch.setattr(segmentlog.os, "fsync", lambda fd: synced.append(
        os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    log = SegmentLog.open(str(tmp_path / "s"))
    reader = log.reader("first")
    log.append_many([b"a", b"b"], 1)
    point = log.sync_point()
    log.append(b"c", 2)
    log.flush()
    assert synced == []
    thread = threading.Thread(target=point.run)
    thread.start()
    thread.join(10)
    # The segment, and the directory that now holds it.
    assert synced == [str(tmp_path / "s" / "00000000000000000000.seg"), str(tmp_path / "s")]
    assert reader.read() == []  # durable, not yet known to be
    log.synced(point)
    assert log.durable_offset == 1
    assert [r[0] for r in reader.read()] == [0, 1]
    again = log.sync_point()
    again.run()
    log.synced(again)
    log.synced(point)  # late or twice: never moves back
    assert (log.durable_offset, [r[0] for r in reader.read()]) == (2, [2])
    assert log.sync_point().fd is None  # nothing left to sync
    log.close()


def test_a_read_takes_at_least_one_record_and_stops_at_its_limits(tmp_path):
    log = SegmentLog.open(str(tmp_path / "s"))
    log.append_many([b"x" * 100] * 5, 1)
    log.sync()
    reader = log.reader("first")
    assert [r[0] for r in reader.read(10, 50)] == [0]  # larger than max_bytes, still one
    assert [r[0] for r in reader.read(10, 250)] == [1, 2]
    assert [r[0] for r in reader.read(1, 10_000)] == [3]
    log.close()


def test_where_readers_start(tmp_path):
    log = SegmentLog.open(str(tmp_path / "s"), **SMALL)
    for offset in range(40):
        log.append(payload(offset, 30), 1000 + 10 * offset)
        if offset % 6 == 5:
            log.flush()  # chunks of six
    log.sync()  # and a last chunk of four: 36..39
    assert len(segment_files(tmp_path / "s")) > 3
    assert read_all(log, "first")[0][0] == 0
    assert [r[0] for r in read_all(log, "last")] == [36, 37, 38, 39]
    assert read_all(log, "next") == []
    assert read_all(log, 17)[0] == (17, 1170, payload(17, 30))
    assert read_all(log, -5)[0][0] == 0
    assert log.reader(99).offset == 40
    assert read_all(log, ("timestamp", 1215))[0][0] == 22
    assert read_all(log, ("timestamp", 1220))[0][0] == 22
    assert read_all(log, ("timestamp", 0))[0][0] == 0
    assert log.reader(("timestamp", 5000)).offset == 40
    for wrong in ("middle", 1.5, True, ("time", 3), ("timestamp", "3")):
        with pytest.raises(ValueError):
            log.reader(wrong)
    log.close()


def test_timestamps_never_go_back(tmp_path):
    log = SegmentLog.open(str(tmp_path / "s"))
    log.append(b"a", 100)
    log.append(b"b", 90)  # a clock stepped back
    log.append_many([b"c"], 80)
    log.sync()
    assert [r[1] for r in read_all(log)] == [100, 100, 100]
    log.close()
    log = SegmentLog.open(str(tmp_path / "s"))
    log.append(b"d", 50)
    log.sync()
    assert read_all(log, 3) == [(3, 100, b"d")]
    log.close()


def test_segments_are_named_by_their_first_offset_and_roll_when_full(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), max_segment_bytes=500)
    log.append_many([payload(o, 60) for o in range(20)], 5)
    log.append(b"y" * 2000, 6)  # larger than a segment: alone in one
    log.append(b"z", 7)
    log.sync()
    names = segment_files(path)
    bases = [int(name[:-4]) for name in names]
    assert bases[0] == 0 and bases[-2:] == [20, 21]
    sizes = [os.path.getsize(path / name) for name in names]
    assert all(size <= 500 for size in sizes[:-2]) and sizes[-2] > 2000
    stats = log.stats()
    assert (stats.segments, stats.bytes, stats.first_offset, stats.last_offset,
            stats.messages) == (len(names), sum(sizes), 0, 21, 22)
    assert [info.first_offset for info in log.segments()] == bases
    log.close()


def test_retention_drops_whole_old_segments_and_never_the_newest(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), **SMALL)
    for offset in range(60):
        log.append(payload(offset, 40), 1000 + offset)
        log.flush()
    log.sync()
    reader = log.reader("first")
    assert [r[0] for r in reader.read(3)] == [0, 1, 2]
    before = log.segments()
    dropped = log.apply_retention(max_bytes=1300)
    assert dropped == before[:len(dropped)] and dropped
    assert sum(info.bytes for info in log.segments()) <= 1300
    assert sum(info.bytes for info in log.segments()) + dropped[-1].bytes > 1300
    assert log.first_offset == dropped[-1].last_offset + 1
    assert reader.read(1)[0][0] == log.first_offset  # moved to the first offset kept
    assert read_all(log, 0)[0][0] == log.first_offset  # an older offset is clamped
    older = log.segments()[:-1]
    assert log.apply_retention(max_age_ms=10, now_ms=1000 + 59 + 10) == older
    assert log.apply_retention(max_bytes=0, max_age_ms=0, now_ms=10**9) == []
    assert len(log.segments()) == 1 and read_all(log)[-1][0] == 59
    assert len(segment_files(path)) == 1
    assert len([n for n in os.listdir(path) if n.endswith(".idx")]) == 1
    log.close()
    log = SegmentLog.open(str(path), **SMALL)
    assert (log.first_offset, log.next_offset) == (log.segments()[0].first_offset, 60)
    log.close()


class PreadCounter:
    """Counts the bytes the log reads from its files."""

    def __init__(self, monkeypatch):
        self.total = 0
        real = os.pread

        def counted(fd, length, at):
            data = real(fd, length, at)
            self.total += len(data)
            return data

        monkeypatch.setattr(segmentlog.os, "pread", counted)


def test_a_seek_or_an_open_reads_one_index_step_not_the_log(tmp_path, monkeypatch):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), max_segment_bytes=200_000, index_records=64,
                          index_bytes=4096)
    size = 100
    for offset in range(6000):
        log.append(payload(offset, size), 10 * offset)
        if offset % 50 == 49:
            log.sync()
    log.sync()
    assert log.stats().bytes > 600_000
    step = 4096 + HEAD_SIZE + 8 + size  # the most an index step holds
    monkeypatch.setattr(segmentlog, "READ_AHEAD", step + HEAD_SIZE + 8 + size)
    monkeypatch.setattr(segmentrecord, "SCAN_READ", step + HEAD_SIZE + 8 + size)
    counter = PreadCounter(monkeypatch)
    for start in (4321, ("timestamp", 43210), "first", "last"):
        counter.total = 0
        assert log.reader(start).read(1)
        assert counter.total <= 2 * segmentlog.READ_AHEAD, start
    log.close()
    counter.total = 0
    log = SegmentLog.open(str(path), max_segment_bytes=200_000, index_records=64,
                          index_bytes=4096)
    segments = len(log.segments())
    assert counter.total < segments * (2 * step + 200_000 // 4096 * segmentlog.ENTRY_SIZE)
    assert read_all(log, 5999)[0] == (5999, 59990, payload(5999, size))
    log.close()


def test_a_stream_of_many_segments_holds_few_descriptors(tmp_path):
    path = tmp_path / "s"

    def held() -> int:
        return sum(os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
                   for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))

    log = SegmentLog.open(str(path), max_segment_bytes=200)
    log.append_many([payload(o, 50) for o in range(200)], 1)  # two records a segment
    log.sync()
    assert len(log.segments()) == 100
    assert held() <= segmentlog.OPEN_SEGMENTS + 2  # and the newest's index
    assert [r[0] for r in read_all(log)] == list(range(200))
    assert held() <= segmentlog.OPEN_SEGMENTS + 2
    log.close()
    log = SegmentLog.open(str(path), max_segment_bytes=200)
    assert held() == 2
    readers = [log.reader(offset) for offset in range(0, 200, 9)]
    assert [reader.read(1)[0][0] for reader in readers] == list(range(0, 200, 9))
    assert held() <= segmentlog.OPEN_SEGMENTS + 2
    assert [r[0] for r in readers[0].read(1000)] == list(range(1, 200))  # reopened as read
    log.close()
    assert held() == 0


def test_readers_at_the_head_read_each_record_from_the_files_once(tmp_path, monkeypatch):
    log = SegmentLog.open(str(tmp_path / "s"), **SMALL)
    readers = [log.reader("next") for _ in range(10)]
    counter = PreadCounter(monkeypatch)
    for turn in range(30):
        for offset in range(turn * 5, turn * 5 + 5):
            log.append(payload(offset, 40), 1000 + offset)
        log.sync()
        for reader in readers:
            assert [r[0] for r in reader.read(50)] == list(range(turn * 5, turn * 5 + 5))
    written = sum(info.bytes for info in log.segments())
    # One reader's pass (each pread may reach past what is durable yet), not ten.
    assert counter.total < 2 * written  # ten readers parsing alone read it ten times
    log.close()


@settings(max_examples=60)
@given(st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 12), st.integers(1, 90)),
    st.tuples(st.just("read"), st.integers(0, 4), st.integers(1, 9), st.integers(1, 400)),
    st.tuples(st.just("reader"), st.sampled_from(["first", "last", "next", 0, 17, 40])),
    st.tuples(st.just("retain"), st.integers(0, 2000))), max_size=40))
def test_readers_sharing_the_newest_records_read_what_a_lone_reader_would(tmp_path_factory, ops):
    log = SegmentLog.open(str(tmp_path_factory.mktemp("s") / "s"), **SMALL)
    readers = [log.reader("first") for _ in range(2)]
    for op in ops:
        if op[0] == "append":
            first = log.next_offset
            for offset in range(first, first + op[1]):
                log.append(payload(offset, op[2]), 1000 + offset)
            log.sync()
        elif op[0] == "reader":
            readers.append(log.reader(op[1]))
        elif op[0] == "retain":
            log.apply_retention(max_bytes=op[1])
        else:
            reader = readers[op[1] % len(readers)]
            start = max(reader.offset, log.first_offset)
            got = reader.read(op[2], op[3])
            offsets = [record[0] for record in got]
            assert offsets == list(range(start, start + len(got)))
            assert all(record[2] == payload(record[0], len(record[2])) for record in got)
            assert len(got) == min(op[2], log.durable_offset + 1 - start) or \
                sum(len(record[2]) for record in got) + 90 > op[3]
    log.close()
