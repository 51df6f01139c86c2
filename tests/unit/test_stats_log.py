"""A shard's statistics log on a disk that refuses writes (full): its thread drops
the lines, says so once, leaves no torn line, and writes again once the disk
takes them; it rotates by size."""

from __future__ import annotations

import errno
import logging
import os

import msgspec

from warren.shards import stats as stats_module
from warren.shards.stats import StatsLog

from ..support.broker import wait_until


def lines_of(path) -> list[dict]:
    with open(path, "rb") as file:
        return [msgspec.json.decode(line) for line in file]


def test_the_writer_survives_a_full_disk_and_writes_again(tmp_path, monkeypatch, caplog):
    real_write = os.write
    full = {"on": False}

    def write(fd, data):
        if full["on"]:  # as a filling disk does: part of it, then ENOSPC
            real_write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(stats_module.os, "write", write)
    caplog.set_level(logging.WARNING, logger="warren.shard")
    stats = StatsLog(str(tmp_path / "logs"), 3)
    try:
        stats.event("before")
        wait_until(lambda: os.path.exists(stats.path) and len(lines_of(stats.path)) == 1)
        full["on"] = True
        for n in range(5):
            stats.event("lost", n=n)
        wait_until(lambda: stats.dropped == 5)
        stats.event("lost", n=5)
        wait_until(lambda: stats.dropped == 6)
        assert stats._writer.is_alive()
        assert [line["kind"] for line in lines_of(stats.path)] == ["before"]  # none torn
        full["on"] = False
        stats.event("after")
        wait_until(lambda: len(lines_of(stats.path)) == 2)
    finally:
        stats.close()
    assert [line["kind"] for line in lines_of(stats.path)] == ["before", "after"]
    said = [r.getMessage() for r in caplog.records if "statistics log" in r.getMessage()]
    assert len(said) == 2, said
    assert "No space left on device" in said[0] and "6 lines dropped" in said[1]


def test_a_log_folder_the_disk_cannot_make_is_made_later(tmp_path, monkeypatch):
    real_makedirs = os.makedirs
    refuse = {"on": True}

    def makedirs(path, exist_ok=False):
        if refuse["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_makedirs(path, exist_ok=exist_ok)

    monkeypatch.setattr(stats_module.os, "makedirs", makedirs)
    stats = StatsLog(str(tmp_path / "logs"), 0)  # a shard starting on a full disk
    try:
        stats.event("lost")
        wait_until(lambda: stats.dropped == 1)
        refuse["on"] = False
        stats.event("kept")
        wait_until(lambda: os.path.exists(stats.path) and len(lines_of(stats.path)) == 1)
    finally:
        stats.close()
    assert [line["kind"] for line in lines_of(stats.path)] == ["kept"]


def test_the_log_rotates_by_size(tmp_path):
    stats = StatsLog(str(tmp_path), 0, max_bytes=1000, backups=2)
    try:
        for n in range(60):
            stats.event("filler", n=n)
            if n % 10 == 9:  # in several writes: rotation is checked before each
                wait_until(lambda: stats._lines.empty())
    finally:
        stats.close()
    kept = lines_of(f"{stats.path}.2") + lines_of(f"{stats.path}.1") + lines_of(stats.path)
    assert not os.path.exists(f"{stats.path}.3")
    numbers = [line["n"] for line in kept]
    assert numbers == sorted(numbers) and numbers[-1] == 59
