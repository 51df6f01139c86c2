"""One log file that several processes append to, rotated by size: no file ever
passes the size and no line is lost, however the processes' lines interleave."""

from __future__ import annotations

import logging
import multiprocessing

from warren.shards.logsetup import SharedRotatingFileHandler

WRITERS = 4
LINES = 400
SIZE = 2000


def _write(path: str, writer: int) -> None:
    handler = SharedRotatingFileHandler(path, maxBytes=SIZE, backupCount=10_000,
                                        encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger(f"rotation-{writer}")
    log.propagate = False
    log.addHandler(handler)
    for n in range(LINES):
        log.warning("writer %d line %04d %s", writer, n, "x" * (n % 40))
    handler.close()


def test_no_file_passes_the_size_and_every_line_is_kept(tmp_path):
    path = tmp_path / "warren.log"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write, args=(str(path), w)) for w in range(WRITERS)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    files = list(tmp_path.iterdir())
    assert len(files) > 10  # rotated many times, with the writers racing each other
    lines = []
    for file in files:
        assert file.stat().st_size <= SIZE, file.name
        lines += file.read_text().splitlines()
    assert sorted(lines) == sorted(f"writer {w} line {n:04d} {'x' * (n % 40)}"
                                   for w in range(WRITERS) for n in range(LINES))
