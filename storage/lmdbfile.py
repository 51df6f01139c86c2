"""An LMDB file read page by page, without LMDB (LMDB 0.9's on-disk layout,
64-bit builds).

LMDB maps its file and reads a page past the file's end by faulting (SIGBUS);
and the file may end before its last page number, since a page freed before it
was first written is never written. So whether a store is truncated, and what a
damaged one still holds, are read here with pread: a page is missing only when
a committed tree reaches it, and a salvage walks what the trees still reach,
skipping what they cannot.

Layout: pages 0 and 1 are the two meta pages (the one with the higher
transaction id is current). A meta holds the free-page tree's and the main
tree's roots; the main tree's leaves name the named databases and hold their
roots. Branch pages hold child page numbers; leaf values too large for a page
live in overflow runs of consecutive pages.
"""

from __future__ import annotations

import os
import struct
from typing import Iterator

_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_PAGE_HEADER = 16
_PAGES = struct.Struct("<I")  # an overflow run's page count (in place of lower, upper)
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_NODE_HEADER = 8
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META = struct.Struct("<IIQQ")  # magic, version, address, map size (then two dbs, last, txnid)
_META_TAIL = struct.Struct("<QQ")  # last page, transaction id
_MAGIC = 0xBEEFC0DE
_BRANCH, _LEAF, _OVERFLOW, _META_FLAG, _LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
BIGDATA, _SUBDATA = 0x01, 0x02  # node flags: a value in overflow pages, a named database
_NO_ROOT = (1 << 64) - 1
_MAX_DEPTH = 64  # far deeper than any real tree: a cycle of damaged pages stops here


class Unreadable(Exception):
    """The file has no valid meta page: not an LMDB file we can walk."""


class Tree:
    """One database's root and what its meta record counts."""

    def __init__(self, raw: bytes):
        (self.psize_or_pad, self.flags, self.depth, self.branch, self.leaf, self.overflow,
         self.entries, self.root) = _DB.unpack(raw)


class LmdbFile:
    def __init__(self, path: str):
        """`path` is the environment's directory."""
        self.fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.size = os.fstat(self.fd).st_size
            head = os.pread(self.fd, _PAGE_HEADER + 136 + 16, 0)
            if len(head) < _PAGE_HEADER + 152:
                raise Unreadable("shorter than a meta page")
            self.psize = Tree(head[40:88]).psize_or_pad
            if self.psize < 512 or self.psize & (self.psize - 1):
                raise Unreadable(f"a page size of {self.psize}")
            metas = [m for m in (self._meta(0, head), self._meta(1)) if m is not None]
            if not metas:
                raise Unreadable("no valid meta page")
            self.txnid, self.last_pgno, self.free, self.main = max(metas, key=lambda m: m[0])
        except BaseException:
            os.close(self.fd)
            raise
        self.missing: set[int] = set()  # pages a tree reaches beyond the file's end
        self.broken: set[int] = set()  # pages a tree reaches that are not what it says
        self.reached = 1  # the highest page a tree reaches, + 1
        self.visited: set[int] = set()  # the tree pages walked

    def _meta(self, pgno: int, raw: bytes | None = None):
        raw = raw or os.pread(self.fd, _PAGE_HEADER + 152, pgno * self.psize)
        if len(raw) < _PAGE_HEADER + 152:
            return None
        _, _, flags, _, _ = _PAGE.unpack_from(raw)
        magic, _, _, _ = _META.unpack_from(raw, _PAGE_HEADER)
        if not flags & _META_FLAG or magic != _MAGIC:
            return None
        at = _PAGE_HEADER + _META.size
        last, txnid = _META_TAIL.unpack_from(raw, at + 2 * _DB.size)
        return txnid, last, Tree(raw[at:at + _DB.size]), Tree(raw[at + _DB.size:at + 2 * _DB.size])

    def close(self) -> None:
        os.close(self.fd)

    def _page(self, pgno: int, count: int = 1) -> bytes | None:
        """Page `pgno` (and the next count-1), or None if the file does not hold
        them all (noted as missing)."""
        self.reached = max(self.reached, pgno + count)
        if (pgno + count) * self.psize > self.size:
            self.missing.add(pgno)
            return None
        return os.pread(self.fd, count * self.psize, pgno * self.psize)

    def walk(self, tree: Tree, values: bool = True) -> Iterator[tuple[bytes, bytes | None, int]]:
        """(key, value, node flags) of every leaf node the tree reaches, in order;
        value None where its overflow pages are missing or broken (or, without
        `values`, for every value in overflow pages: only their extent is checked).
        A page whose keys are out of order (with each other, or with the keys of
        the branch that leads to it) is broken: a damaged key would otherwise
        move a record (a message to another queue) without failing a checksum."""
        self._values = values
        if tree.root != _NO_ROOT:
            # The free tree's keys are native integers, not compared as bytes.
            yield from self._walk(tree.root, 0, None, None, tree is not self.free)

    def _walk(self, pgno: int, depth: int, low: bytes | None, high: bytes | None,
              ordered: bool):
        page = self._page(pgno) if depth < _MAX_DEPTH else None
        if page is None:
            if depth >= _MAX_DEPTH:
                self.broken.add(pgno)
            return
        self.visited.add(pgno)
        yield from self._nodes(pgno, page, depth, low, high, ordered)

    def _nodes(self, pgno: int, page: bytes, depth: int, low: bytes | None = None,
               high: bytes | None = None, ordered: bool = False):
        """The leaf nodes under the page; keys within [low, high) if ordered."""
        got, _, flags, lower, upper = _PAGE.unpack_from(page)
        count = (lower - _PAGE_HEADER) >> 1
        if (got != pgno or not flags & (_BRANCH | _LEAF) or flags & _LEAF2
                or lower < _PAGE_HEADER or lower > upper or upper > self.psize):
            self.broken.add(pgno)
            return
        nodes = []
        for i in range(count):
            (at,) = struct.unpack_from("<H", page, _PAGE_HEADER + 2 * i)
            if at < upper or at + _NODE_HEADER > self.psize:
                self.broken.add(pgno)
                return
            lo, hi, node_flags, ksize = _NODE.unpack_from(page, at)
            key = page[at + _NODE_HEADER:at + _NODE_HEADER + ksize]
            nodes.append((lo, hi, node_flags, key, at + _NODE_HEADER + ksize))
        keys = [node[3] for node in nodes[1 if flags & _BRANCH else 0:]]  # a branch's first: none
        if ordered and (any(a >= b for a, b in zip(keys, keys[1:])) or (keys and (
                (low is not None and keys[0] < low) or (high is not None and keys[-1] >= high)))):
            self.broken.add(pgno)
            return
        for i, (lo, hi, node_flags, key, data_at) in enumerate(nodes):
            if flags & _BRANCH:
                yield from self._walk(lo | hi << 16 | node_flags << 32, depth + 1,
                                      key if i else low,
                                      nodes[i + 1][3] if i + 1 < len(nodes) else high, ordered)
                continue
            size = lo | hi << 16
            if node_flags & BIGDATA and data_at + 8 > self.psize:
                self.broken.add(pgno)
                return
            if node_flags & BIGDATA:
                (first,) = struct.unpack_from("<Q", page, data_at)
                yield key, self._overflow(first, size), node_flags
            elif data_at + size > self.psize:
                self.broken.add(pgno)
                return
            else:
                yield key, page[data_at:data_at + size], node_flags

    def _overflow(self, pgno: int, size: int) -> bytes | None:
        head = self._page(pgno)
        if head is None:
            return None
        got, _, flags, _, _ = _PAGE.unpack_from(head)
        (pages,) = _PAGES.unpack_from(head, 12)
        if got != pgno or not flags & _OVERFLOW or _PAGE_HEADER + size > pages * self.psize:
            self.broken.add(pgno)
            return None
        if not self._values:
            self.reached = max(self.reached, pgno + pages)
            if (pgno + pages) * self.psize > self.size:
                self.missing.add(pgno)
            return None
        run = self._page(pgno, pages)
        return None if run is None else run[_PAGE_HEADER:_PAGE_HEADER + size]

    def free_pages(self) -> set[int]:
        """The pages the free-page tree lists (each value: a count, then page numbers
        in descending order). A list that is not so, or that names a page past the
        last, a meta page, or one twice, makes its page broken."""
        free: set[int] = set()
        for key, value, _ in self.walk(self.free):
            if value is None:
                continue
            whole = len(value) >= 8 and struct.unpack_from("<Q", value)[0] == len(value) // 8 - 1
            pages = struct.unpack_from(f"<{len(value) // 8 - 1}Q", value, 8) if whole else ()
            if (not whole or len(key) != 8 or any(a <= b for a, b in zip(pages, pages[1:]))
                    or (pages and (pages[-1] < 2 or pages[0] > self.last_pgno))
                    or free.intersection(pages)):
                self.broken.add(self.free.root)
            free.update(pages)
        return free

    def orphan_leaves(self) -> Iterator[tuple[bytes, bytes | None, int]]:
        """The leaf nodes of pages in the file that no walk reached and the free
        tree does not list: what a tree whose branch pages are missing held (and,
        if the free tree is lost too, perhaps records already deleted)."""
        free = self.free_pages()
        for pgno in range(2, self.size // self.psize):
            if pgno in self.visited or pgno in free:
                continue
            page = os.pread(self.fd, self.psize, pgno * self.psize)
            got, _, flags, _, _ = _PAGE.unpack_from(page)
            if got == pgno and flags & (_LEAF | _BRANCH | _OVERFLOW | _LEAF2) == _LEAF:
                self._values = True
                yield from self._nodes(pgno, page, 0)

    def databases(self) -> dict[bytes, Tree]:
        """The named databases the main tree lists."""
        return {key: Tree(value) for key, value, flags in self.walk(self.main)
                if flags & _SUBDATA and value is not None and len(value) == _DB.size}

    def reach_everything(self) -> None:
        """Walk every tree a commit left (the free pages' too): after it, `missing`
        holds the pages they reach beyond the file's end."""
        for tree in self.databases().values():
            for _ in self.walk(tree, values=False):
                pass
        if self.free_pages() & self.visited:  # (the walks visited the free tree's pages too)
            self.broken.add(self.free.root)
