"""A journal on a full disk: growing it fails without leaving part of a block (a
journal that is not whole blocks reads as truncated after a crash) or holding
the space it took, and the append that needed it leaves the records before it
as they were."""

from __future__ import annotations

import errno
import os

import pytest

from warren.storage import journal as journal_module
from warren.storage.journal import BLOCK, Journal


@pytest.mark.parametrize("direct", [True, False])
def test_a_grow_the_disk_refuses_gives_its_space_back(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(journal_module, "DIRECT", direct)
    path = str(tmp_path / "journal")
    journal = Journal(path)
    try:
        journal.append(1, b"kept")
        size = os.path.getsize(path)
        real = os.pwrite

        def pwrite(fd, data, offset):
            if offset >= size:  # the grow: a disk with 1,000 bytes left
                real(fd, data[:1000], offset)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, offset)

        monkeypatch.setattr(journal_module.os, "pwrite", pwrite)
        with pytest.raises(OSError):
            journal.append(2, b"x" * (size + BLOCK))
        assert os.path.getsize(path) == size and size % BLOCK == 0
        monkeypatch.setattr(journal_module.os, "pwrite", real)
        journal.append(2, b"after")  # room again: it goes on where it stopped
        assert journal.records() == [(1, b"kept"), (2, b"after")]
    finally:
        journal.close()
    assert journal_module.read(path) == [(1, b"kept"), (2, b"after")]


def test_a_journal_a_flood_grew_shrinks_once_the_flood_has_passed(tmp_path):
    """A start-over after a big cycle keeps the size (a steady flood would only
    zero-fill it again); one after a small or empty cycle gives the disk back."""
    path = str(tmp_path / "journal")
    journal = Journal(path)
    try:
        journal.append(1, b"x" * (3 * journal_module.GROW_BY))  # a flood's cycle
        grown = os.path.getsize(path)
        assert grown > journal_module.GROW_BY
        journal.start_over()
        assert os.path.getsize(path) == grown
        journal.append(2, b"small")
        journal.start_over()
        assert os.path.getsize(path) == journal_module.GROW_BY
        journal.append(3, b"after")
        assert journal.records() == [(3, b"after")]
    finally:
        journal.close()
