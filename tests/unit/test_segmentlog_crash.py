"""A stream's segment log after a crash or damage: whatever byte a crash stops
the newest segment at, every synced record is there after a reopen and offsets
run on without a gap; a damaged record before the torn tail is reported, never
dropped.

A crash is a copy of the log's directory taken while it is open (what the page
cache held), with the newest segment cut at any byte past what was synced, a
hole of zeros in what it kept past that, or garbage written after its end."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.storage import segmentlog, segmentrecord
from warren.storage.segmentlog import SegmentLog, SegmentLogDamaged

from .test_segmentlog import SMALL, payload, read_all, segment_files


def crash_copy(source, target, cut_from: int | None, fraction: float, garbage: bytes,
               hole: tuple[float, int] = (0.0, 0)):
    """The directory as a crash leaves it: the newest segment cut at a byte at or
    past `cut_from` (None: not cut), with a `hole` of zeros in what it kept past
    `cut_from` (the kernel wrote a later page but not an earlier one), then
    `garbage` after its end."""
    shutil.copytree(source, target)
    newest = target / segment_files(target)[-1] if segment_files(target) else None
    if newest is None:
        return
    size = os.path.getsize(newest)
    if cut_from is not None and cut_from <= size:
        end = cut_from + int((size - cut_from) * fraction)
        with open(newest, "r+b") as file:
            file.truncate(end)
            at = cut_from + int((end - cut_from) * hole[0])
            file.seek(at)
            file.write(bytes(min(hole[1], end - at)))
    with open(newest, "ab") as file:
        file.write(garbage)


def flip(path, name: str, at: int) -> None:
    with open(path / name, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0x5A]))


def test_a_reader_of_a_log_that_kept_only_an_empty_segment_reads_nothing(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), max_segment_bytes=100)
    log.append_many([b"x" * 60] * 3, 1)
    log.flush()  # two full segments synced, the third not
    crash_copy(path, tmp_path / "c", 0, 0.0, b"")
    log.close()
    log = SegmentLog.open(str(tmp_path / "c"), max_segment_bytes=100)
    assert (log.next_offset, log.durable_offset) == (2, 1)
    assert len(log.apply_retention(max_bytes=0)) == 2
    assert (log.first_offset, log.reader("first").read(), log.stats().messages) == (2, [], 0)
    log.append(b"y", 2)
    log.sync()
    assert read_all(log, "last") == [(2, 2, b"y")]
    log.close()


def test_an_index_lost_or_torn_is_rebuilt_from_its_segment(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), **SMALL)
    for offset in range(50):
        log.append(payload(offset, 20), offset)
    log.sync()
    log.close()
    indexes = sorted(n for n in os.listdir(path) if n.endswith(".idx"))
    kept = {name: os.path.getsize(path / name) for name in indexes}
    os.unlink(path / indexes[0])
    with open(path / indexes[-1], "r+b") as file:
        file.truncate(kept[indexes[-1]] - 5)
    log = SegmentLog.open(str(path), **SMALL)
    assert [r[0] for r in read_all(log)] == list(range(50))
    assert read_all(log, 3)[0][0] == 3
    log.close()
    assert {name: os.path.getsize(path / name) for name in indexes} == kept


def test_a_torn_tail_is_cut_back_to_the_last_whole_record(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path))
    log.append_many([payload(o, 50) for o in range(5)], 1)
    log.sync()
    synced = os.path.getsize(path / segment_files(path)[0])
    log.append_many([payload(o, 50) for o in range(5, 9)], 2)
    log.flush()
    crash_copy(path, tmp_path / "c", synced, 0.6, b"")
    log.close()
    log = SegmentLog.open(str(tmp_path / "c"))
    assert log.next_offset == 7 and log.durable_offset == 6  # two records were whole
    assert [r[0] for r in read_all(log)] == list(range(7))
    log.append(b"after", 3)
    log.sync()
    assert read_all(log, 7) == [(7, 3, b"after")]
    log.close()


def test_a_hole_the_crash_left_before_later_records_is_the_tail(tmp_path):
    """The kernel may write a later page of an unsynced flush and not an earlier
    one: recovery starts where the index says it was synced, not at its last entry."""
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), index_records=1)
    log.append_many([payload(o, 50) for o in range(3)], 1)
    log.sync()
    synced = os.path.getsize(path / segment_files(path)[0])
    log.append_many([payload(o, 50) for o in range(3, 9)], 2)
    log.flush()
    crash_copy(path, tmp_path / "c", synced, 1.0, b"", (0.3, 20))
    log.close()
    log = SegmentLog.open(str(tmp_path / "c"), index_records=1)
    assert log.next_offset == 4  # the record at 30% of the unsynced bytes is in the hole
    assert [r[0] for r in read_all(log)] == list(range(4))
    log.close()


def test_an_intact_record_out_of_sequence_is_damage(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path))
    log.append_many([b"a", b"b"], 5)
    log.sync()
    log.close()
    stray = bytearray()
    segmentrecord.encode(stray, b"c", 7, 5, None)  # offset 7 where 2 belongs
    with open(path / segment_files(path)[0], "ab") as file:
        file.write(stray)
    with pytest.raises(SegmentLogDamaged, match="has offset 7"):
        SegmentLog.open(str(path))


def test_a_full_segment_is_synced_before_the_next_exists(tmp_path, monkeypatch):
    events = []
    real_open, real_sync = os.open, os.fdatasync
    monkeypatch.setattr(segmentlog.os, "open", lambda name, *args: events.append(
        ("open", os.path.basename(name))) or real_open(name, *args))
    monkeypatch.setattr(segmentlog.os, "fdatasync", lambda fd: events.append(
        ("sync", os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[1])) or real_sync(fd))
    log = SegmentLog.open(str(tmp_path / "s"), max_segment_bytes=300)
    log.append_many([payload(o, 60) for o in range(12)], 1)
    log.flush()
    names = segment_files(tmp_path / "s")
    assert len(names) > 2
    for older, newer in zip(names, names[1:]):
        index = older[:-4] + ".idx"
        assert events.index(("sync", older)) < events.index(("open", newer))
        assert events.index(("sync", index)) < events.index(("open", newer))
    log.close()


def test_a_read_only_open_reads_a_crashed_log_and_writes_nothing(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), **SMALL)
    for offset in range(30):
        log.append(payload(offset, 30), offset)
    log.sync()
    synced = os.path.getsize(path / segment_files(path)[-1])
    log.append_many([payload(o, 30) for o in range(30, 34)], 40)
    log.flush()
    crash_copy(path, tmp_path / "c", synced, 0.5, b"garbage")
    log.close()
    crashed = tmp_path / "c"
    os.unlink(crashed / (segment_files(crashed)[0][:-4] + ".idx"))
    before = {name: (crashed / name).read_bytes() for name in os.listdir(crashed)}
    log = SegmentLog.open(str(crashed), readonly=True, **SMALL)
    assert [r[0] for r in read_all(log)] == list(range(log.next_offset))
    assert read_all(log, 3)[0] == (3, 3, payload(3, 30))
    assert 30 <= log.next_offset < 34
    log.append(b"x", 50)
    with pytest.raises(PermissionError):
        log.flush()
    with pytest.raises(PermissionError):
        log.apply_retention(max_bytes=0)
    log.close()
    assert {name: (crashed / name).read_bytes() for name in os.listdir(crashed)} == before


@pytest.mark.parametrize("where, back", [("newest", 90), ("older", 20)])
def test_damage_before_the_tail_is_reported(tmp_path, where, back):
    """In the newest segment, a record that a later chunk says was synced; in an
    older one, its last index step (read at open)."""
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), **SMALL)
    for offset in range(30):
        log.append(payload(offset, 30), offset)
        log.sync()
    log.close()
    names = segment_files(path)
    name = names[-1] if where == "newest" else names[0]
    flip(path, name, os.path.getsize(path / name) - back)
    with pytest.raises(SegmentLogDamaged, match="damaged"):
        SegmentLog.open(str(path), **SMALL)


def test_damage_inside_an_older_segment_is_reported_when_read(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), max_segment_bytes=5000, index_records=4, index_bytes=200)
    log.append_many([payload(o, 30) for o in range(100)], 1)
    log.sync()
    log.close()
    flip(path, segment_files(path)[0], 100)
    log = SegmentLog.open(str(path), max_segment_bytes=5000, index_records=4, index_bytes=200)
    with pytest.raises(SegmentLogDamaged, match="offset 1"):
        read_all(log)
    assert read_all(log, 40)[0][0] == 40  # a seek past it reads on
    log.close()


def test_offsets_out_of_sequence_are_damage(tmp_path):
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), max_segment_bytes=200)
    log.append_many([payload(o, 50) for o in range(10)], 1)
    log.sync()
    log.close()
    names = segment_files(path)
    os.unlink(path / names[1])  # a segment lost in the middle
    with pytest.raises(SegmentLogDamaged, match="starts at offset"):
        SegmentLog.open(str(path), max_segment_bytes=200)


operations = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 120), st.integers(-5, 30)),
    st.tuples(st.just("many"), st.integers(0, 12), st.integers(0, 60), st.integers(-5, 30)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("sync")),
    st.tuples(st.just("read"), st.integers(1, 9)),
    st.tuples(st.sampled_from(["bytes", "age"]), st.integers(0, 3000)),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("crash"), st.booleans(), st.floats(0, 1), st.binary(max_size=80),
              st.tuples(st.floats(0, 1), st.integers(0, 150))),
), min_size=20, max_size=60)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations, st.data())
def test_any_history_of_appends_retention_and_crashes_keeps_every_synced_record(
        tmp_path_factory, ops, data):
    root = tmp_path_factory.mktemp("log")
    path = root / "0"
    log = SegmentLog.open(str(path), **SMALL)
    model: dict[int, tuple[int, bytes]] = {}  # offset: (timestamp, payload), kept and pending
    clock = last = 0
    synced_at: tuple[str, int] | None = None  # the newest segment and its length, at a sync
    reader, read = log.reader("first"), 0  # a long-lived reader, and the offset it is at

    def check_reader(limit: int) -> None:
        nonlocal read
        for offset, timestamp, body in reader.read(limit):
            assert offset == max(read, log.first_offset)
            assert model[offset] == (timestamp, body)
            read = offset + 1

    for number, op in enumerate(ops):
        if op[0] in ("append", "many"):
            clock += op[-1]
            last = max(last, clock)
            sizes = [op[1]] if op[0] == "append" else [op[2]] * op[1]
            first = log.next_offset
            bodies = [payload(first + i, size) for i, size in enumerate(sizes)]
            if op[0] == "append":
                assert log.append(bodies[0], clock) == first
            else:
                assert log.append_many(bodies, clock) == range(first, first + len(sizes))
            model.update((first + i, (last, body)) for i, body in enumerate(bodies))
        elif op[0] == "flush":
            log.flush()
        elif op[0] == "sync":
            log.sync()
            assert log.durable_offset == log.next_offset - 1
            names = segment_files(path)
            synced_at = (names[-1], os.path.getsize(path / names[-1])) if names else None
        elif op[0] == "read":
            check_reader(op[1])
        elif op[0] in ("bytes", "age"):
            before = log.segments()
            if op[0] == "bytes":
                dropped = log.apply_retention(max_bytes=op[1])
            else:
                dropped = log.apply_retention(max_age_ms=op[1] // 10, now_ms=last)
            assert dropped == before[:len(dropped)] and len(log.segments()) >= min(1, len(before))
            for info in dropped:
                assert info.bytes and (op[0] == "bytes"
                                       or model[info.last_offset][0] < last - op[1] // 10)
                for offset in range(info.first_offset, info.last_offset + 1):
                    del model[offset]
            kept = log.segments()
            if op[0] == "bytes" and len(kept) > 1:
                assert sum(info.bytes for info in kept) <= op[1]
            check_reader(3)
        else:
            durable = log.durable_offset
            target = root / str(number + 1)
            if op[0] == "reopen":
                log.close()
                shutil.copytree(path, target)
                durable = log.next_offset - 1
            else:
                names = segment_files(path)
                cut = None
                if op[1] and names:
                    cut = synced_at[1] if synced_at and synced_at[0] == names[-1] else 0
                crash_copy(path, target, cut, op[2], op[3], op[4])
                log.close()
            path = target
            log = SegmentLog.open(str(path), **SMALL)
            # Every synced record is kept; what was written past it is kept up to where
            # the crash cut it; offsets run on from the first kept without a gap.
            assert durable < log.next_offset and log.durable_offset == log.next_offset - 1
            model = {o: value for o, value in model.items() if o < log.next_offset}
            last = max((model[o][0] for o in model), default=0)
            assert len(model) == log.next_offset - log.first_offset
            if len(model):
                assert min(model) == log.first_offset
            names = segment_files(path)
            synced_at = (names[-1], os.path.getsize(path / names[-1])) if names else None
            reader, read = log.reader("first"), log.first_offset
    log.sync()
    found = read_all(log)
    assert [(o, t, b) for o, t, b in found] == [(o, *model[o]) for o in sorted(model)]
    assert [r[0] for r in found] == list(range(log.first_offset, log.next_offset))
    offsets = sorted(model)
    for offset in data.draw(st.lists(st.integers(-2, log.next_offset + 2), max_size=4)):
        got = log.reader(offset).read(1)
        clamped = min(max(offset, log.first_offset), log.next_offset)
        assert got == ([(clamped, *model[clamped])] if clamped < log.next_offset else [])
    for moment in data.draw(st.lists(st.integers(-5, last + 5), max_size=4)):
        want = next((o for o in offsets if model[o][0] >= moment), log.next_offset)
        assert log.reader(("timestamp", moment)).offset == want
    log.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 90), st.sampled_from(["", "flush", "sync"])),
                min_size=1, max_size=40), st.data())
def test_damage_to_any_synced_record_is_reported(tmp_path_factory, history, data):
    """Every byte of a segment but the newest chunk's (written after a sync) belongs
    to a record that was synced: a flipped one is reported at open or when read."""
    root = tmp_path_factory.mktemp("log")
    log = SegmentLog.open(str(root / "s"), **SMALL)
    for size, then in history:
        log.append(payload(log.next_offset, size), 1)
        if then == "flush":
            log.flush()
        elif then == "sync":
            log.sync()
    log.sync()
    newest = segment_files(root / "s")[-1]
    synced = os.path.getsize(root / "s" / newest)
    log.append(b"after the sync", 2)
    log.flush()
    shutil.copytree(root / "s", root / "c")  # a crash now: the last chunk not synced
    log.close()
    names = segment_files(root / "c")
    if names[-1] != newest:  # the last chunk rolled: the old newest is whole
        synced = os.path.getsize(root / "c" / newest)
    candidates = [n for n in names if n <= newest and (n != newest or synced)]
    name = data.draw(st.sampled_from(candidates))
    limit = synced if name == newest else os.path.getsize(root / "c" / name)
    flip(root / "c", name, data.draw(st.integers(0, limit - 1)))
    with pytest.raises(SegmentLogDamaged):
        log = SegmentLog.open(str(root / "c"), **SMALL)
        read_all(log)


def test_a_chunk_torn_at_an_index_entry_keeps_the_clock_of_the_record_before(tmp_path):
    """The entry of a chunk's first record says the bytes before it were synced;
    if the crash tore that record, recovery still finds the last whole record
    (its timestamp is the floor for the next ones)."""
    path = tmp_path / "s"
    log = SegmentLog.open(str(path), index_records=3)
    log.append_many([b"a", b"b", b"c"], 50)
    log.sync()
    synced = os.path.getsize(path / segment_files(path)[0])
    log.append(b"d", 60)  # offset 3: an index entry, at the synced length
    log.flush()
    crash_copy(path, tmp_path / "c", synced, 0.5, b"")
    log.close()
    log = SegmentLog.open(str(tmp_path / "c"), index_records=3)
    assert (log.next_offset, read_all(log, "last")) == (3, [(0, 50, b"a"), (1, 50, b"b"),
                                                          (2, 50, b"c")])
    log.append(b"e", 40)
    log.close()
    log = SegmentLog.open(str(tmp_path / "c"), index_records=3)
    assert read_all(log, 3) == [(3, 50, b"e")]
    log.close()
